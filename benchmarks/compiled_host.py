"""Where a compiled (mode="default", no CUDA graphs) step's host time goes, ViT against LKAT (issue 19).

Each model `torch.compile(fullgraph=True)` with fused AdamW under bf16 autocast at batch 128, 224², as `bench_model.py
--compare` times it; a training step, or with --phase infer an inference step (no gradients, eval mode). Per model: the
median synchronised step and the fastest of three queued rounds (no stamps), then steps with `perf_counter` around
inductor's compiled-graph calls (host ms per graph, keyed by its number of inputs: the forward's and the backward's) and
around every kernel launch inductor makes (`CachingAutotuner.run`: calls and host µs by kernel, user-defined or
inductor's, launched by the static launcher or Triton's) and around every dispatcher op the graphs call
(`OpOverload.__call__`: our custom ops, whose kernels their own Python issues through Triton's launcher, calls and host
µs by op), so the host time outside the two graphs (guards, AOTAutograd's wrappers, gradient accumulation, the
optimizer) is the step's issue time minus the graphs'; and one step under CUDA's sync debug mode ("warn"), listing any
call that synchronises. TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=1 in the environment launches our
kernels through inductor's static launcher; `static_user` in the JSON records which ran.

    python benchmarks/compiled_host.py --name compiled_host_tiny
    python benchmarks/compiled_host.py --size small --phase infer --name compiled_host_small_infer
    TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=1 python benchmarks/compiled_host.py --name ..._static
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback
import warnings
from pathlib import Path

import torch
from bench_eager_host import synchronised_ms  # benchmarks/ is the script folder
from bench_model import pipelined_ms, training_run
from common import dated_result_path, environment, write_result
from torch._inductor import output_code
from torch._inductor.runtime import triton_heuristics

ORIGINAL_LAUNCH = triton_heuristics.CachingAutotuner.run
ORIGINAL_GRAPH_CALL = output_code.CompiledFxGraph.__call__
ORIGINAL_OP_CALL = torch._ops.OpOverload.__call__
launches: dict[tuple, list] = {}
graph_calls: list[tuple[int, float]] = []
op_calls: dict[str, list] = {}
op_depth = [0]


def timed_launch(self, *args, **kwargs):
    """CachingAutotuner.run, its host time added to `launches` under (kernel, user-defined, launcher)."""
    start = time.perf_counter()
    try:
        return ORIGINAL_LAUNCH(self, *args, **kwargs)
    finally:
        spent = time.perf_counter() - start
        launcher = self.launchers[0] if getattr(self, "launchers", None) else None
        user = self.heuristic_type == triton_heuristics.HeuristicType.USER_AUTOTUNE
        key = (self.fn.__name__, user, "static" if getattr(launcher, "_is_static", False) else "triton")
        entry = launches.setdefault(key, [0, 0.0])
        entry[0] += 1
        entry[1] += spent


def timed_graph_call(self, inputs):
    """CompiledFxGraph.__call__, its host time appended to `graph_calls` with its number of inputs."""
    n_inputs, start = len(inputs), time.perf_counter()  # the callee clears the boxed inputs
    try:
        return ORIGINAL_GRAPH_CALL(self, inputs)
    finally:
        graph_calls.append((n_inputs, time.perf_counter() - start))


def timed_op_call(self, *args, **kwargs):
    """OpOverload.__call__ (the graphs' calls of custom and other dispatcher ops), its host time added to `op_calls`
    under the op's name; ops called inside another are in their caller's time only."""
    op_depth[0] += 1
    start = time.perf_counter()
    try:
        return ORIGINAL_OP_CALL(self, *args, **kwargs)
    finally:
        op_depth[0] -= 1
        if op_depth[0] == 0:
            entry = op_calls.setdefault(str(self), [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - start


def stamped_steps(step, steps: int) -> list[float]:
    """Host ms to issue each of `steps` steps with the graph and launch stamps installed (synchronised after each step,
    outside its time)."""
    triton_heuristics.CachingAutotuner.run = timed_launch
    output_code.CompiledFxGraph.__call__ = timed_graph_call
    torch._ops.OpOverload.__call__ = timed_op_call
    launches.clear()
    graph_calls.clear()
    op_calls.clear()
    host = []
    try:
        for _ in range(steps):
            start = time.perf_counter()
            step()
            host.append((time.perf_counter() - start) * 1e3)
            torch.cuda.synchronize()
    finally:
        triton_heuristics.CachingAutotuner.run = ORIGINAL_LAUNCH
        output_code.CompiledFxGraph.__call__ = ORIGINAL_GRAPH_CALL
        torch._ops.OpOverload.__call__ = ORIGINAL_OP_CALL
    return host


def synchronising_calls(step) -> list[str]:
    """The warnings CUDA's sync debug mode raises during one step (at most 20)."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    return [f"{w.message} @ {w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message).lower()][:20]


def probe(name: str, steps: int, batch: int, phase: str) -> dict:
    """One model's row (module docstring) for its `phase` ("train_step" or "infer")."""
    setup = training_run(name, "default", "cuda", batch, 224, tune_first=name.startswith("lkat"))
    setup.model.train(phase == "train_step")
    step = getattr(setup, phase)
    for _ in range(5):
        step()
    walls = synchronised_ms(step, steps)
    queued = pipelined_ms(step, steps, "cuda")
    host = stamped_steps(step, steps)
    graphs: dict[int, list] = {}
    for n_inputs, spent in graph_calls:
        entry = graphs.setdefault(n_inputs, [0, 0.0])
        entry[0] += 1
        entry[1] += spent
    graph_ms = {str(n): {"calls": c / steps, "host_ms": t / steps * 1e3} for n, (c, t) in graphs.items()}
    rows = sorted(((k, n / steps, s / steps * 1e3) for k, (n, s) in launches.items()), key=lambda r: -r[2])
    kinds: dict[str, list] = {}
    for (_, user, launcher), calls, ms in rows:
        kind = kinds.setdefault(f"{'user-defined' if user else 'inductor'}, {launcher} launcher", [0.0, 0.0])
        kind[0] += calls
        kind[1] += ms
    issue_ms = statistics.median_high(host)
    result = {
        "model": name,
        "phase": phase,
        "step_ms_synchronised": statistics.median_high(walls),
        "step_ms_queued": queued,
        "host_issue_ms_with_stamps": issue_ms,
        "graph_calls": graph_ms,
        "host_ms_outside_graphs": issue_ms - sum(g["host_ms"] for g in graph_ms.values()),
        "launch_kinds": {k: {"launches": v[0], "host_ms": v[1]} for k, v in kinds.items()},
        "top_launches": [
            {"kernel": k[0], "user": k[1], "launcher": k[2], "calls": c, "host_ms": ms, "us_per_call": ms * 1e3 / c}
            for k, c, ms in rows[:25]
        ],
        "top_op_calls": [
            {"op": op, "calls": n / steps, "host_ms": t / steps * 1e3, "us_per_call": t * 1e6 / n}
            for op, (n, t) in sorted(op_calls.items(), key=lambda item: -item[1][1])[:15]
        ],
        "syncs": synchronising_calls(step),
    }
    torch._dynamo.reset()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny", choices=["tiny", "small", "base"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--models", nargs="+", default=["vit", "lkat"], choices=["vit", "lkat"])
    parser.add_argument("--phase", default="train_step", choices=["train_step", "infer"])
    parser.add_argument("--name", default=None, help="result name (default compiled_host_<size>[_infer])")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("compiled_host.py needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = True
    env = environment()
    default_name = f"compiled_host_{args.size}" + ("_infer" if args.phase == "infer" else "")
    out = args.out or dated_result_path(args.name or default_name, env)
    payload = {
        "environment": env,
        "static_user": torch._inductor.config.static_launch_user_defined_triton_kernels,
        "batch": args.batch,
        "rows": [],
    }
    for name in (f"{m}_{args.size}_patch16_224" for m in args.models):
        try:
            payload["rows"].append(probe(name, args.steps, args.batch, args.phase))
        except Exception:
            payload["rows"].append({"model": name, "error": traceback.format_exc()[-3000:]})
        write_result(out, payload)
        row = payload["rows"][-1]
        print(name, {k: row[k] for k in row if k.startswith(("step", "host"))} if "error" not in row else row["error"])


if __name__ == "__main__":
    main()
