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
synchronised steps each, LKAT's speed against ViT's by their fastest steps and by the medians of their block medians;
then their eager inference steps the same way.
"kan_paths": the "ratio" timing with three LKATs of each size, their KAN layers on "auto", "fused" and "triton".
"graphs": the "ratio" timing with two LKATs of each size, the kernels of their GLA cores and KAN layers launched one by
one (eager_graphs=False) and replayed as CUDA graphs (the default; kernels/graphed.py).
"phases": the "ratio" timing of the training steps, each step's host time split at the return of its forward (with the
loss), backward, optimizer step and zeroing of the gradients; the rest is the wait for the GPU.
"inside": LKAT's eager training step with the host time of our code timed from inside (ViT's and LKAT's steps
untimed first, for scale): the forward and backward of each of our autograd Functions, the kernels' host functions
the GLA core runs (INSIDE) and every Triton launch, each with the share of its time spent in the launches it makes.
The lent GPU machines' host runs an eager step's Python at a speed that moves by up to 2x between processes and within
one (ViT-T's block medians 19-39 ms, LKAT-T's 36-87 ms; the main thread's CPU time equals the wall time, so the step
computes rather than waits, H100 machine 2026-11-28): the fastest step is the estimate least moved by it.
A training step: bf16 autocast, fused AdamW, batch --batch at 224², synchronised after --iters steps; an inference
step: the model in eval mode under no_grad and bf16 autocast. Writes JSON and prints markdown.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from bench_model import Config, build, lkat, vit  # benchmarks/ is the script folder
from common import dated_result_path, environment, write_result

import lkat_lens
from lkat_lens.kernels import gla_core, gla_fla, gla_input, gla_short, kan_linear, rbf, tuned

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
# an eager training step's phases, timed on the host: the forward with the loss, the backward, the optimizer's step,
# zeroing the gradients, and the wait for the GPU to finish (the synchronised step's rest)
PHASES = ("forward", "backward", "optimizer", "zero_grad", "wait")
KAN_PATHS = ("auto", "fused", "triton")  # the KAN layers' paths "kan_paths" forces (set_backends(kan=...))
# the "graphs" comparison's eager_graphs settings (the GLA core's and the KAN layers' kernels; the core's alone before
# the KAN layers took them, in the results of 2026-11-29 named "core launched" and "core graphed")
GRAPHS = {False: "launched", True: "graphed"}
# the kernels' host functions "inside" times, by the module whose namespace the caller reads them from
INSIDE = {
    gla_core: ("gla_qkv_fwd", "gla_gate_fwd", "SHORT_FORWARD", "gated_norm_fwd",
               "gated_norm_bwd", "SHORT_BACKWARD", "gla_gate_bwd", "gla_qkv_bwd"),
    kan_linear: ("backward_and_output",),
}  # fmt: skip


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


def training_step(config: Config, batch: int, stamps: list | None = None) -> Callable[[], None]:
    """One eager training step of a fresh model (bench_model's build: 1000 classes, 224²) on synthetic data; with
    `stamps`, each step appends its host times (perf_counter) at its start and after each phase (PHASES[:-1])."""
    torch.manual_seed(0)
    model = build(config, 224).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")

    def step():
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        forward = time.perf_counter()
        loss.backward()
        backward = time.perf_counter()
        opt.step()
        optimizer = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if stamps is not None:
            stamps.append((start, forward, backward, optimizer, time.perf_counter()))

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
    """Rows of the "ratio" comparison: each size's ViT and LKAT eager training steps, interleaved; then their eager
    inference steps, the same way."""
    return interleaved_rows(args, lambda size: [lkat(size, "auto")])


def compare_kan_paths(args: argparse.Namespace) -> list[dict]:
    """Rows of the "kan_paths" comparison: as "ratio", with LKAT's KAN layers on each of KAN_PATHS."""
    return interleaved_rows(args, lambda size: [replace(lkat(size, "auto"), kan=path) for path in KAN_PATHS])


def compare_graphs(args: argparse.Namespace) -> list[dict]:
    """Rows of the "graphs" comparison: as "ratio", with LKAT's GLA cores and KAN layers launched one by one and as
    CUDA graphs."""

    def lkats(size: str) -> list[Config]:
        config = lkat(size, "auto")
        return [replace(config, label=f"{config.label}, {GRAPHS[on]}", eager_graphs=on) for on in GRAPHS]

    return interleaved_rows(args, lkats)


def interleaved_rows(args: argparse.Namespace, lkats: Callable[[str], list[Config]]) -> list[dict]:
    """For each size, ViT's and `lkats(size)`'s eager training steps interleaved, then their inference steps."""
    rows = []
    for size in args.sizes:
        configs = [vit(size), *lkats(size)]
        for what, make in (("training", training_step), ("inference", inference_step)):
            steps = {_label(config): make(config, args.batch) for config in configs}
            against = " / ".join(list(steps)[1:])
            rows.append(interleaved(steps, args) | {"what": f"{against} against {configs[0].label}, eager {what} step",
                                                    "phase": what})  # fmt: skip
            del steps
            torch.cuda.empty_cache()
    return rows


def _label(config: Config) -> str:
    """A config's row label, with its KAN path when one is forced."""
    return config.label + (f", KAN {config.kan}" if config.kan else "")


def interleaved(steps: dict[str, Callable[[], None]], args: argparse.Namespace) -> dict:
    """ViT's step (the first) and LKAT's steps, --rounds blocks of --iters synchronised steps each, alternating after
    --warmup steps of each: their times, block medians, fastest steps and each LKAT's speed against ViT's by both; the
    memory each step's warm-up left allocated (optimizer states, CUDA-graph captures' tensors) and reserved beyond
    what it found (the allocator's growth, captures' memory pools included; the steps before it leave their cache to
    it), and each step's peak above the memory allocated before it, in MiB."""
    held, reserved, peak = {}, {}, {}
    for name, step in steps.items():
        torch.cuda.synchronize()
        before, before_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        for _ in range(args.warmup):
            step()
        torch.cuda.synchronize()
        held[name] = (torch.cuda.memory_allocated() - before) / 2**20
        reserved[name] = (torch.cuda.memory_reserved() - before_reserved) / 2**20
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak[name] = (torch.cuda.max_memory_allocated() - before) / 2**20
    times: dict[str, list[float]] = {name: [] for name in steps}
    blocks: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            block = synchronised_ms(step, args.iters)
            times[name] += block
            blocks[name].append(statistics.median(block))
    vit_label, *lkat_labels = steps
    fastest = {name: min(t) for name, t in times.items()}
    typical = {name: statistics.median(b) for name, b in blocks.items()}
    return {
        "times": times, "block_medians": blocks, "fastest_ms": fastest, "block_median_ms": typical,
        "held_MiB": held, "reserved_MiB": reserved, "step_peak_MiB": peak,
        "lkat_lens": lkat_lens.__file__,
        "fastest_x_vit": {name: fastest[vit_label] / fastest[name] for name in lkat_labels},
        "block_median_x_vit": {name: typical[vit_label] / typical[name] for name in lkat_labels},
    }  # fmt: skip


def compare_phases(args: argparse.Namespace) -> list[dict]:
    """Rows of the "phases" timing: each size's ViT and LKAT eager training steps, interleaved as "ratio" runs them,
    with the host time of each phase (PHASES) by its median over the steps."""
    rows = []
    for size in args.sizes:
        configs = (vit(size), lkat(size, "auto"))
        stamps: dict[str, list] = {config.label: [] for config in configs}
        steps = {config.label: training_step(config, args.batch, stamps[config.label]) for config in configs}
        result = interleaved(steps, args)
        phases = {}
        for (name, step_stamps), step_times in zip(stamps.items(), result["times"].values(), strict=True):
            timed = step_stamps[-len(step_times) :]  # the warm-up's stamps came first
            spans = [[(b - a) * 1e3 for a, b in itertools.pairwise(s)] for s in timed]
            spans = [[*s, total - sum(s)] for s, total in zip(spans, step_times, strict=True)]
            columns = zip(*spans, strict=True)
            phases[name] = {p: statistics.median(column) for p, column in zip(PHASES, columns, strict=True)}
        rows.append(result | {"what": f"{configs[1].label} against {configs[0].label}, eager training step by phase",
                              "phase_ms": phases})  # fmt: skip
        del steps
        torch.cuda.empty_cache()
    return rows


class InsideTimers:
    """Host time of wrapped functions (inclusive) by label, with the share of it spent in the Triton launches they
    make (`launch=True` marks the launch itself)."""

    def __init__(self) -> None:
        self.seconds: collections.Counter = collections.Counter()
        self.launch_seconds: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()
        self._inner: list[float] = []  # the launch time of each open call

    def wrap(self, label: str, fn: Callable, launch: bool = False) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self._inner.append(0.0)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                inner = self._inner.pop()
                in_launches = spent if launch else inner
                self.seconds[label] += spent
                self.launch_seconds[label] += in_launches
                self.calls[label] += 1
                if self._inner:
                    self._inner[-1] += in_launches

        return timed

    def clear(self) -> None:
        for counter in (self.seconds, self.launch_seconds, self.calls):
            counter.clear()


def _our_functions() -> Iterator[type]:
    """Every torch.autograd.Function subclass defined in lkat_lens (those `differentiable` makes included)."""
    todo = list(torch.autograd.Function.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__module__.startswith("lkat_lens."):
            yield cls


@contextlib.contextmanager
def timed_inside(timers: InsideTimers) -> Iterator[None]:
    """Our autograd Functions' forward and backward, the INSIDE functions and TunedKernel.run wrapped by `timers`."""
    with contextlib.ExitStack() as patches:
        for cls in _our_functions():
            name = cls.__name__.removeprefix("Eager_")
            for method in ("forward", "backward"):
                if method in vars(cls):
                    timed = timers.wrap(f"{name} {method}", getattr(cls, method))
                    patches.enter_context(mock.patch.object(cls, method, staticmethod(timed)))
        for module, names in INSIDE.items():
            for name in names:
                patches.enter_context(mock.patch.object(module, name, timers.wrap(name, getattr(module, name))))
        launch = timers.wrap("Triton launch (TunedKernel.run)", tuned.TunedKernel.run, launch=True)
        patches.enter_context(mock.patch.object(tuned.TunedKernel, "run", launch))
        yield


def compare_inside(args: argparse.Namespace) -> list[dict]:
    """Rows of the "inside" timing: for each size, ViT's and LKAT's eager training steps untimed (medians of
    --rounds x --iters synchronised steps), then LKAT's with our code timed from inside."""
    rows = []
    for size in args.sizes:
        plain, configs = {}, (vit(size), lkat(size, "auto"))
        for config in configs:
            step = training_step(config, args.batch)
            for _ in range(args.warmup):
                step()
            plain[config.label] = statistics.median(synchronised_ms(step, args.rounds * args.iters))
        step, timers = training_step(configs[1], args.batch), InsideTimers()
        with timed_inside(timers):
            for _ in range(args.warmup):
                step()
            timers.clear()
            times = synchronised_ms(step, args.rounds * args.iters)
        steps = len(times)
        parts = {
            label: {"ms_per_step": seconds / steps * 1e3, "calls_per_step": timers.calls[label] / steps,
                    "us_per_call": seconds / timers.calls[label] * 1e6,
                    "launch_ms_per_step": timers.launch_seconds[label] / steps * 1e3}
            for label, seconds in timers.seconds.most_common()
        }  # fmt: skip
        rows.append({"what": f"{configs[1].label} eager training step, our code timed inside",
                     "plain_step_median_ms": plain, "timed_step_median_ms": statistics.median(times),
                     "parts": parts})  # fmt: skip
        torch.cuda.empty_cache()
    return rows


def synchronised_ms(step: Callable[[], None], count: int) -> list[float]:
    """ms of each of `count` steps, each between two synchronisations of the GPU."""
    times = []
    for _ in range(count):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    comparisons = {
        "callers": (compare_callers, PATHS),
        "threads": (compare_threads, THREADS),
        "launches": (compare_launches, LAUNCHES),
        "steps": (compare_steps, ("as is",)),
        "ratio": (compare_ratio, ()),
        "kan_paths": (compare_kan_paths, ()),
        "graphs": (compare_graphs, ()),
        "phases": (compare_phases, PHASES),
        "inside": (compare_inside, ()),
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
        if name in ("ratio", "kan_paths", "graphs", "phases"):
            for r in (r for r in rows if r["comparison"] == name):
                print(f"\n{r['what']} ({r['gpu']}, {r['lkat_lens']}):")
                for model, ratio in r["fastest_x_vit"].items():
                    print(f"  {model}: {ratio:.3f}x by the fastest steps ({r['fastest_ms'][model]:.1f} ms), "
                          f"{r['block_median_x_vit'][model]:.3f}x by the block medians")  # fmt: skip
                print(f"  ViT's fastest step {next(iter(r['fastest_ms'].values())):.1f} ms")
                memory = [f"{m} {r['held_MiB'][m]:.0f} / {r['reserved_MiB'][m]:.0f} / {r['step_peak_MiB'][m]:.0f}"
                          for m in r["held_MiB"]]  # fmt: skip
                print("  MiB held after the warm-up / reserved by it / a step's peak above what it started with: "
                      + ", ".join(memory))  # fmt: skip
                for model, phases in r.get("phase_ms", {}).items():
                    print(f"  {model}, host ms by phase (medians): "
                          + ", ".join(f"{p} {ms:.2f}" for p, ms in phases.items()))  # fmt: skip
            continue
        if name == "inside":
            for r in (r for r in rows if r["comparison"] == name):
                steps = ", ".join(f"{model} {ms:.1f} ms" for model, ms in r["plain_step_median_ms"].items())
                print(f"\n{r['what']} ({r['gpu']}): untimed steps {steps}; timed {r['timed_step_median_ms']:.1f} ms")
                print("| what | ms a step | calls a step | us a call | of it in Triton launches, ms a step |")
                print("|---|---|---|---|---|")
                for label, p in r["parts"].items():
                    print(f"| {label} | {p['ms_per_step']:.2f} | {p['calls_per_step']:.0f} | {p['us_per_call']:.1f} | "
                          f"{p['launch_ms_per_step']:.2f} |")  # fmt: skip
            continue
        print(f"\n| {name}: what | " + " | ".join(f"{v} (median; all rounds)" for v in variants) + " | GPU |")
        print("|---|" + "---|" * (len(variants) + 1))
        for r in (r for r in rows if r["comparison"] == name):
            cells = [f"{r[f'{v}_median']:.1f} ({', '.join(f'{t:.1f}' for t in r['times'][v])})" for v in variants]
            print(f"| {r['what']} | " + " | ".join(cells) + f" | {r['gpu']} |")


if __name__ == "__main__":
    main()
