"""Host time of eager training on a GPU: comparisons alternated --rounds times in one process, or the steps alone.

    python benchmarks/bench_eager_host.py --sizes tiny small --compare callers threads

"callers": kernels.autograd_ops gives every custom op an eager caller (a plain torch.autograd.Function around the
functions the ops run, called directly); the ops themselves carry torch.library's dispatch and autograd wrapper. The
model's callers are swapped for the ops ("library") and back ("eager"): the host time of one forward + backward of
each op at a tiny shape (the GPU's time negligible), and the time of an eager training step of LKAT at each size.
"threads": an eager training step of ViT and of LKAT at each size with the backward on the autograd engine's device
thread ("device", torch's default) and on the calling thread ("caller", torch.autograd.set_multithreading_enabled
(False), as the trainer runs it).
"launches": LKAT's eager step at each size with our autotuned Triton kernels started directly once compiled
(kernels.tuned.DIRECT, "direct", the default) and through Triton's JITFunction.run on every call ("jit").
"steps": ViT's and LKAT's eager training and inference steps as they are, for comparing two trees of lkat_lens run
as alternating processes (put the other tree's export first on PYTHONPATH: `git archive REV lkat_lens | tar -x -C
DIR`; each row names the lkat_lens it imported).
"ratio": ViT's and LKAT's eager training steps of a size interleaved in one process, --rounds blocks of --iters
synchronised steps each, LKAT's speed against ViT's by their fastest steps and by the medians of their block medians.
The lent GPU machines' host runs an eager step's Python at a speed that moves by up to 2x between processes and within
one (ViT-T's block medians 19-39 ms, LKAT-T's 36-87 ms; the main thread's CPU time equals the wall time, so the step
computes rather than waits, H100 machine 2026-11-28): the fastest step is the estimate least moved by it.
A training step: bf16 autocast, fused AdamW, batch --batch at 224², synchronised after --iters steps; an inference
step: the model in eval mode under no_grad and bf16 autocast. Writes JSON and prints markdown.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from bench_model import Config, build, lkat, vit  # benchmarks/ is the script folder
from common import dated_result_path, environment, write_result

import lkat_lens
from lkat_lens.kernels import gla_fla, gla_input, gla_short, kan_linear, rbf, tuned

# (module, the eager caller's name, the op's name): the callers the model's code looks up at call time
CALLERS = [
    (gla_input, "_gla_input", "_gla_input_op"),
    (gla_short, "_gla_short", "_gla_short_op"),
    (gla_fla, "_fla_gla", "_fla_gla_op"),
    (rbf, "_rbf", "_rbf_op"),
    (kan_linear, "_kan_fused", "_kan_fused_op"),
    (kan_linear, "_edge_fused", "_edge_fused_op"),
]
EAGER = {(module, caller): getattr(module, caller) for module, caller, _ in CALLERS}
PATHS = ("library", "eager")
THREADS = ("device", "caller")
LAUNCHES = ("direct", "jit")


def use(path: str) -> None:
    """Point the model's callers at the ops themselves ("library") or at the eager callers ("eager")."""
    for module, caller, op in CALLERS:
        setattr(module, caller, EAGER[module, caller] if path == "eager" else getattr(module, op))


def host_us(fn: Callable[[], object], calls: int) -> float:
    """Microseconds of host time per call (the GPU synchronised before and after the timed calls)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def op_cases() -> dict[str, Callable[[], None]]:
    """One forward + backward of each op at a tiny shape, under bf16 autocast."""
    dev, (B, T, H, D) = "cuda", (1, 16, 2, 64)

    def leaf(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=dev, dtype=dtype, requires_grad=True)

    x, conv, norm = leaf(B, T, H * D), leaf(H * D, 1, 4, dtype=torch.float32), leaf(D, dtype=torch.float32)
    cos, sin = torch.ones(T, D, device=dev), torch.zeros(T, D, device=dev)
    q, k, v = leaf(B, T, H, D), leaf(B, T, H, D), leaf(B, T, H, D)
    gk = (F.logsigmoid(torch.randn(B, T, H, D, device=dev)) / 16).requires_grad_()
    xk, gw, W = leaf(64, 128), leaf(1, 4, dtype=torch.float32), leaf(256, 128)

    def autocast(fn):
        def run():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = fn()
            y.float().sum().backward()

        return run

    return {
        "gla_input (q/k)": autocast(lambda: gla_input.gla_input(x, conv, norm, cos, sin, heads=H)),
        "gla_short": autocast(lambda: gla_short.gla_short(q, k, v, gk)),
        "kan_linear triton": autocast(lambda: kan_linear.kan_linear(xk, gw, W, -2.0, 2.0, backend="triton")),
        "kan_linear fused": autocast(lambda: kan_linear.kan_linear(xk, gw, W, -2.0, 2.0, backend="fused")),
    }


def training_step(config: Config, batch: int) -> Callable[[], None]:
    """One eager training step of a fresh model (bench_model's build: 1000 classes, 224²) on synthetic data."""
    torch.manual_seed(0)
    model = build(config, 224).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def inference_step(config: Config, batch: int) -> Callable[[], None]:
    """One eager inference step (no_grad, bf16 autocast) of a fresh model in eval mode on synthetic data."""
    torch.manual_seed(0)
    model = build(config, 224).eval()
    x = torch.randn(batch, 3, 224, 224, device="cuda")

    def step():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            model(x)

    return step


def alternate(
    step: Callable[[], None], variants: dict[str, Callable[[], None]], warmup: int, iters: int, rounds: int
) -> dict[str, list[float]]:
    """ms per step under each variant (its setup called first), --rounds times each, alternating."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, setup in variants.items():
            setup()
            for _ in range(warmup):
                step()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(iters):
                step()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - start) / iters * 1e3)
    return times


def row(what: str, times: dict[str, list[float]]) -> dict:
    """A result row: what was timed, each variant's times and median."""
    return {"what": what, "times": times, **{f"{v}_median": statistics.median(t) for v, t in times.items()}}


def compare_callers(args: argparse.Namespace) -> list[dict]:
    """Rows of the "callers" comparison: each op's host time, then LKAT's eager steps."""
    rows = []
    for name, fn in op_cases().items():
        times: dict[str, list[float]] = {path: [] for path in PATHS}
        for _ in range(args.rounds):
            for path in PATHS:
                use(path)
                times[path].append(host_us(fn, args.calls))
        rows.append(row(f"{name} forward + backward, host us", times))
    paths = {path: functools.partial(use, path) for path in PATHS}
    for size in args.sizes:
        config = lkat(size, "auto")
        times = alternate(training_step(config, args.batch), paths, args.warmup, args.iters, args.rounds)
        rows.append(row(f"{config.label} eager training step, ms", times))
    use("eager")
    return rows


def compare_threads(args: argparse.Namespace) -> list[dict]:
    """Rows of the "threads" comparison: ViT's and LKAT's eager steps at each size."""
    threads = {t: functools.partial(torch.autograd.set_multithreading_enabled, t == "device") for t in THREADS}
    rows = []
    for size in args.sizes:
        for config in (vit(size), lkat(size, "auto")):
            times = alternate(training_step(config, args.batch), threads, args.warmup, args.iters, args.rounds)
            rows.append(row(f"{config.label} eager training step, ms", times))
    torch.autograd.set_multithreading_enabled(False)
    return rows


def compare_launches(args: argparse.Namespace) -> list[dict]:
    """Rows of the "launches" comparison: LKAT's eager steps at each size."""

    def launch(how: str) -> None:
        tuned.DIRECT = how == "direct"

    launches = {how: functools.partial(launch, how) for how in LAUNCHES}
    rows = []
    for size in args.sizes:
        config = lkat(size, "auto")
        times = alternate(training_step(config, args.batch), launches, args.warmup, args.iters, args.rounds)
        rows.append(row(f"{config.label} eager training step, ms", times))
    tuned.DIRECT = True
    return rows


def compare_steps(args: argparse.Namespace) -> list[dict]:
    """Rows of the "steps" timing: ViT's and LKAT's eager training and inference steps at each size, as they are."""
    rows = []
    for size in args.sizes:
        for config in (vit(size), lkat(size, "auto")):
            for what, make in (("training", training_step), ("inference", inference_step)):
                times = alternate(make(config, args.batch), {"as is": lambda: None}, args.warmup, args.iters,
                                  args.rounds)  # fmt: skip
                rows.append(row(f"{config.label} eager {what} step, ms", times) | {"lkat_lens": lkat_lens.__file__})
    return rows


def compare_ratio(args: argparse.Namespace) -> list[dict]:
    """Rows of the "ratio" comparison: each size's ViT and LKAT eager training steps, interleaved."""
    rows = []
    for size in args.sizes:
        steps = {config.label: training_step(config, args.batch) for config in (vit(size), lkat(size, "auto"))}
        for step in steps.values():
            for _ in range(args.warmup):
                step()
        times: dict[str, list[float]] = {name: [] for name in steps}
        blocks: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.rounds):
            for name, step in steps.items():
                block = []
                for _ in range(args.iters):
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    step()
                    torch.cuda.synchronize()
                    block.append((time.perf_counter() - start) * 1e3)
                times[name] += block
                blocks[name].append(statistics.median(block))
        vit_label, lkat_label = steps
        fastest = {name: min(t) for name, t in times.items()}
        typical = {name: statistics.median(b) for name, b in blocks.items()}
        rows.append({
            "what": f"{lkat_label} against {vit_label}, eager training step", "times": times, "block_medians": blocks,
            "fastest_ms": fastest, "block_median_ms": typical, "lkat_lens": lkat_lens.__file__,
            "fastest_x_vit": fastest[vit_label] / fastest[lkat_label],
            "block_median_x_vit": typical[vit_label] / typical[lkat_label],
        })  # fmt: skip
    return rows


def main() -> None:
    comparisons = {
        "callers": (compare_callers, PATHS),
        "threads": (compare_threads, THREADS),
        "launches": (compare_launches, LAUNCHES),
        "steps": (compare_steps, ("as is",)),
        "ratio": (compare_ratio, ()),
    }
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=["tiny", "small", "base"])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=300, help="timed calls per op and round")
    parser.add_argument("--compare", nargs="+", default=["callers", "threads"], choices=list(comparisons))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as the trainer under autocast
    torch.autograd.set_multithreading_enabled(False)  # as the trainer ("threads" compares both)
    env = environment()
    rows = []
    for name in args.compare:
        run, variants = comparisons[name]
        for r in run(args):
            rows.append({"comparison": name, **r, **env})
    write_result(args.out or dated_result_path("bench_eager_host", env), rows)
    for name in args.compare:
        variants = comparisons[name][1]
        if name == "ratio":
            for r in (r for r in rows if r["comparison"] == name):
                print(f"\n{r['what']}: {r['fastest_x_vit']:.3f}x by the fastest steps "
                      f"({', '.join(f'{k} {v:.1f} ms' for k, v in r['fastest_ms'].items())}), "
                      f"{r['block_median_x_vit']:.3f}x by the block medians; {r['gpu']}, {r['lkat_lens']}")  # fmt: skip
            continue
        print(f"\n| {name}: what | " + " | ".join(f"{v} (median; all rounds)" for v in variants) + " | GPU |")
        print("|---|" + "---|" * (len(variants) + 1))
        for r in (r for r in rows if r["comparison"] == name):
            cells = [f"{r[f'{v}_median']:.1f} ({', '.join(f'{t:.1f}' for t in r['times'][v])})" for v in variants]
            print(f"| {r['what']} | " + " | ".join(cells) + f" | {r['gpu']} |")


if __name__ == "__main__":
    main()
