"""The GLA core's short kernels traced or as custom ops in a compiled LKAT, beside ViT, interleaved in one process.

Issue 19: inductor drops the register cap of a user-defined Triton kernel, so the traced short kernels run slower
on the device, while the custom ops (`LKAT.set_backends(cuda_graphs=True)`, kernels/gla_core.py) cost host time on
every call. Three runs of one size at batch 128, 224², each `torch.compile(mode, fullgraph=True)` with fused AdamW
under bf16 autocast (`bench_model.training_run`): ViT, LKAT with the short kernels traced, LKAT with them as ops. After
warm-up, --rounds rounds (the order rotating) time --iters synchronised training steps and inference steps of each;
the JSON holds every round's median and fastest step and each LKAT's ratio to ViT (per round, their median, and of
the fastest steps). On the lent machines a step's host time moves between processes and within one, so only ratios
taken in one round compare.

    python benchmarks/bench_short_ops.py --mode default --out benchmarks/results/bench_short_ops-h200-<date>.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from bench_eager_host import synchronised_ms  # benchmarks/ is the script folder
from bench_model import training_run
from common import dated_result_path, environment, write_result

RUNS = ("vit", "traced", "ops")
PHASES = ("train_step", "infer")


def summary(rounds: list[dict]) -> dict:
    """Each LKAT run's ratio to ViT (ViT's step time over its own) by phase: per round, their median, fastest steps."""
    out = {}
    for phase in PHASES:
        for name in RUNS[1:]:
            ratios = [r[f"vit {phase}"]["median"] / r[f"{name} {phase}"]["median"] for r in rounds]
            fastest = min(r[f"vit {phase}"]["min"] for r in rounds) / min(r[f"{name} {phase}"]["min"] for r in rounds)
            out[f"{name} {phase} x vit"] = {
                "per_round_median": ratios,
                "median": statistics.median(ratios),
                "fastest_steps": fastest,
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny", choices=["tiny", "small", "base"])
    parser.add_argument("--mode", default="default", help="torch.compile's mode")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_short_ops.py needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = True
    env = environment()
    out = args.out or dated_result_path(f"bench_short_ops_{args.size}_{args.mode}", env)
    result: dict = {"environment": env, "size": args.size, "mode": args.mode, "compile_s": {}, "rounds": []}
    runs = {}
    for name in RUNS:
        start = time.time()
        model = f"{'vit' if name == 'vit' else 'lkat'}_{args.size}_patch16_224"
        backends = None if name == "vit" else {"cuda_graphs": name == "ops"}
        runs[name] = training_run(model, args.mode, "cuda", 128, 224, backends=backends, tune_first=name != "vit")
        for phase in PHASES:  # compiles both graphs (and records them under CUDA graphs)
            runs[name].model.train(phase == "train_step")
            for _ in range(3):
                getattr(runs[name], phase)()
        torch.cuda.synchronize()
        result["compile_s"][name] = time.time() - start
    for index in range(args.rounds):
        row = {}
        for name in RUNS[index % len(RUNS) :] + RUNS[: index % len(RUNS)]:
            for phase in PHASES:
                runs[name].model.train(phase == "train_step")
                ms = synchronised_ms(getattr(runs[name], phase), args.iters)
                row[f"{name} {phase}"] = {"median": statistics.median(ms), "min": min(ms)}
        result["rounds"].append(row)
        print(index, {key: round(value["median"], 2) for key, value in row.items()}, flush=True)
        write_result(out, result)
    result["summary"] = summary(result["rounds"])
    write_result(out, result)
    for key, value in result["summary"].items():
        print(f"{key}: median {value['median']:.3f}, fastest steps {value['fastest_steps']:.3f}")


if __name__ == "__main__":
    main()
