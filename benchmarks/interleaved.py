"""Compiled training runs of one process timed in interleaved rounds, and their step-time ratios (issue 19).

On the lent GPU machines a step's host time moves between processes and within one, so a variant is timed beside
its base in one process, round after round with the order rotating, and only ratios taken in one round compare.
`bench_short_ops.py` and `bench_flat_params.py` build their runs with `bench_model.training_run` and time them here.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from bench_eager_host import synchronised_ms  # benchmarks/ is the script folder
from bench_model import TrainingRun
from common import dated_result_path, environment, write_result
from profile_step import profile_step

PHASES = ("train_step", "infer")


def parser(description: str, rounds: int, mode_help: str = "torch.compile's mode") -> argparse.ArgumentParser:
    """The options of every interleaved script: --size, --mode, --rounds (default `rounds`), --iters, --profile and
    --out."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny", choices=["tiny", "small", "base"])
    parser.add_argument("--mode", default="default", help=mode_help)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="TOP",
        help="after the rounds, profile one step of every run and phase, keeping its TOP kernels (default 0: none)",
    )
    parser.add_argument("--out", type=Path, default=None)
    return parser


def prepared(args: argparse.Namespace, script: str) -> tuple[dict, Path]:
    """TF32 matmuls on (as bench_model times models), after checking for a GPU; the environment record and the
    output path (--out, else results/<script>_<size>_<mode>-<gpu>-<date>.json)."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{script}.py needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = True
    env = environment()
    return env, args.out or dated_result_path(f"{script}_{args.size}_{args.mode}", env)


def warm(run: TrainingRun) -> None:
    """Three steps of each phase (compiling both graphs, recording them under CUDA graphs)."""
    for phase in PHASES:
        run.model.train(phase == "train_step")
        for _ in range(3):
            getattr(run, phase)()
    torch.cuda.synchronize()


def timed_rounds(runs: dict[str, TrainingRun], rounds: int, iters: int, on_round: Callable[[list], None]) -> list:
    """`rounds` rounds, each timing `iters` synchronised steps of every run and phase (the runs' order rotating by
    one each round): per round, "<run> <phase>" -> the median and fastest step in ms. `on_round(rows so far)` after
    each round (to print and save partial results)."""
    names, rows = list(runs), []
    for index in range(rounds):
        row = {}
        for name in names[index % len(names) :] + names[: index % len(names)]:
            for phase in PHASES:
                runs[name].model.train(phase == "train_step")
                ms = synchronised_ms(getattr(runs[name], phase), iters)
                row[f"{name} {phase}"] = {"median": statistics.median(ms), "min": min(ms)}
        rows.append(row)
        on_round(rows)
    return rows


def ratio_summary(rounds: list[dict], pairs: Sequence[tuple[str, str]]) -> dict:
    """Per (run, base) pair and phase, the run's speed against its base (the base's step time over the run's): per
    round, their median, and of the fastest steps of all rounds."""
    out = {}
    for phase in PHASES:
        for name, base in pairs:
            ratios = [r[f"{base} {phase}"]["median"] / r[f"{name} {phase}"]["median"] for r in rounds]
            fastest = min(r[f"{base} {phase}"]["min"] for r in rounds) / min(
                r[f"{name} {phase}"]["min"] for r in rounds
            )
            out[f"{name} {phase} x {base}"] = {
                "per_round_median": ratios,
                "median": statistics.median(ratios),
                "fastest_steps": fastest,
            }
    return out


def profiles(runs: dict[str, TrainingRun], top: int, device: str = "cuda") -> dict:
    """One profiled step (profile_step.py) of every run and phase, "<run> <phase>" -> its profile with `top` kernels:
    which kernels a variant's step spends its device time on, beside its base's."""
    out = {}
    for name, run in runs.items():
        for phase in PHASES:
            run.model.train(phase == "train_step")
            out[f"{name} {phase}"] = profile_step(getattr(run, phase), device, top)
    return out


def run_and_write(
    runs: dict[str, TrainingRun], pairs: Sequence[tuple[str, str]], args, result: dict, out: Path
) -> None:
    """Time `runs` in --rounds interleaved rounds of --iters steps, writing `result` (with its rounds and their
    ratio summary, then with --profile the profiles) to `out` after every round; prints each round and the summary."""

    def on_round(rows: list) -> None:
        print(len(rows) - 1, {key: round(value["median"], 2) for key, value in rows[-1].items()}, flush=True)
        write_result(out, {**result, "rounds": rows})

    result["rounds"] = timed_rounds(runs, args.rounds, args.iters, on_round)
    result["summary"] = ratio_summary(result["rounds"], pairs)
    write_result(out, result)
    for key, value in result["summary"].items():
        print(f"{key}: median {value['median']:.3f}, fastest steps {value['fastest_steps']:.3f}")
    if args.profile:
        result["profiles"] = profiles(runs, args.profile)
        write_result(out, result)
        for key, value in result["profiles"].items():
            print(f"{key}: {value['device_time_ms']:.2f} ms of kernels, {value['device_kernels']} kernels", flush=True)
