"""Where a synchronised compiled training step's host time goes before its forward CUDA graph starts (issue 19).

ViT and LKAT of one size, each `torch.compile(mode="reduce-overhead", fullgraph=True)` with fused AdamW under bf16
autocast at batch 128, 224². No profiler (it slows the host 2-4×): `perf_counter` stamps wrapped around
AOTAutograd's `unwrap_dead_wrappers`, inductor's compiled-graph call, cudagraph trees' manager and node, and
`CUDAGraph.replay`, medians of 30 steps in ms from each step's start; and the time of one check of the compiled
forward's guards (`guard_check_us`). Needs CUDA; writes results/host_timeline_<size>-<gpu>-<date>.json.

    python benchmarks/host_timeline.py --size tiny
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._functorch.aot_autograd  # noqa: F401  (loads the runtime wrappers stamped below)
import torch._inductor.cudagraph_trees as cudagraph_trees
import torch._inductor.output_code as output_code
from bench_flat_guards import guard_check_times  # benchmarks/ is the script folder
from bench_model import training_run
from common import dated_result_path, environment, write_result

STEPS, WARMUP, GUARD_CHECKS = 30, 15, 200
stamps: list[tuple[str, float]] = []


def stamping(owner, attr: str, label: str) -> None:
    """Replace owner.attr by a wrapper that stamps its entry and return."""
    original = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        stamps.append((label, time.perf_counter()))
        result = original(*args, **kwargs)
        stamps.append((label + " returned", time.perf_counter()))
        return result

    setattr(owner, attr, wrapper)


def install_stamps() -> None:
    stamping(output_code.CompiledFxGraph, "__call__", "CompiledFxGraph.__call__")
    stamping(cudagraph_trees.CUDAGraphTreeManager, "run", "TreeManager.run")
    stamping(cudagraph_trees.CUDAGraphTreeManager, "execute_node", "TreeManager.execute_node")
    stamping(cudagraph_trees.CUDAGraphNode, "run", "Node.run")
    stamping(cudagraph_trees.CUDAGraphNode, "check_invariants", "Node.check_invariants")
    stamping(torch.cuda.CUDAGraph, "replay", "replay")
    for name, module in list(sys.modules.items()):  # a Python function in torch 2.11, imported by name
        torch_internal = name.startswith(("torch._functorch", "torch._dynamo"))
        if torch_internal and module and hasattr(module, "unwrap_dead_wrappers"):
            stamping(module, "unwrap_dead_wrappers", f"unwrap_dead_wrappers({name})")


def guard_check_us(model: torch.nn.Module, x: torch.Tensor) -> float | None:
    """Mean microseconds of one check of the compiled forward's guards (None where dynamo keeps no cache entry or its
    guards fail the call)."""
    try:
        times, _ = guard_check_times(model, x, GUARD_CHECKS)
    except (LookupError, RuntimeError):
        return None
    return statistics.fmean(times)


def timeline(name: str) -> dict:
    """The medians of the stamps up to the forward's replay, and the guards' check, for one model."""
    setup = training_run(name, "reduce-overhead", "cuda", 128, 224, tune_first=True)
    rows = []

    def step(record: bool = False) -> None:
        stamps.clear()
        t0 = time.perf_counter()
        setup.train_step()
        torch.cuda.synchronize()
        if record:
            first = next(i for i, (label, _) in enumerate(stamps) if label == "replay")
            rows.append([(label, (t - t0) * 1e3) for label, t in stamps[: first + 1]])

    for _ in range(WARMUP):
        step()
    for _ in range(STEPS):
        step(record=True)
    labels = [label for label, _ in rows[0]]
    medians = [sorted(r[i][1] for r in rows)[len(rows) // 2] for i in range(len(labels))]
    result = {"model": name, "stamps_ms": dict(zip(labels, medians, strict=True))}
    result["guard_check_us"] = guard_check_us(setup.model, setup.x)
    result["inputs"] = sum(1 for _ in setup.model.parameters()) + sum(1 for _ in setup.model.buffers())
    torch._dynamo.reset()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny", choices=["tiny", "small", "base"])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    env = environment()
    out = args.out or dated_result_path(f"host_timeline_{args.size}", env)
    install_stamps()
    rows = []
    for name in (f"vit_{args.size}_patch16_224", f"lkat_{args.size}_patch16_224"):
        rows.append(timeline(name) | env)
        write_result(out, rows)
        print(name, f"guards {rows[-1]['guard_check_us']} us")
        for label, ms in rows[-1]["stamps_ms"].items():
            print(f"   {ms:7.3f} ms  {label}")


if __name__ == "__main__":
    main()
