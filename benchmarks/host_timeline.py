"""Where a synchronised compiled training step's host time goes (issue 19).

ViT and LKAT of one size (with --flat, each flattened as well: lkat_lens.flat_params), each `torch.compile(mode=
"reduce-overhead", fullgraph=True)` with fused AdamW under bf16 autocast at batch 128, 224². No profiler (it slows the
host 2-4×, and hid a flattened step's loss under CUDA graphs): `perf_counter` stamps wrapped around AOTAutograd's
`unwrap_dead_wrappers`, inductor's compiled-graph call, cudagraph trees' manager and node, and `CUDAGraph.replay`
(`stamps_ms`: each stamp up to the forward's replay, ms from the step's start), and around the step's phases
(`phases_ms`: forward with the loss, backward, optimizer step, zero_grad, then the wait for the device), medians of 30
steps; and the time of one check of the compiled forward's guards (`guard_check_us`). Needs CUDA; writes
results/host_timeline_<size>-<gpu>-<date>.json.

    python benchmarks/host_timeline.py --size tiny --flat
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
    stamping(torch.Tensor, "backward", "Tensor.backward")
    for name, module in list(sys.modules.items()):  # a Python function in torch 2.11, imported by name
        torch_internal = name.startswith(("torch._functorch", "torch._dynamo"))
        if torch_internal and module and hasattr(module, "unwrap_dead_wrappers"):
            stamping(module, "unwrap_dead_wrappers", f"unwrap_dead_wrappers({name})")


def stamp_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Stamp one optimizer's step and zero_grad (with install_stamps' Tensor.backward, the ends of PHASES)."""
    stamping(optimizer, "step", "optimizer.step")
    stamping(optimizer, "zero_grad", "optimizer.zero_grad")


PHASES = ("forward", "backward", "optimizer", "zero_grad", "device")
# the stamp that ends each phase; the step's end (after synchronising) ends the last
PHASE_ENDS = ("Tensor.backward", "optimizer.step", "optimizer.zero_grad", "optimizer.zero_grad returned")


def phases_ms(step: list[tuple[str, float]], start: float, end: float) -> dict[str, float]:
    """One step's host ms per phase (PHASES) and in all ("step"), from its stamps (label, perf_counter seconds), start
    and end: a phase runs from the stamp that ends the one before it (or the start) to the first stamp that ends it."""
    bounds = [start, *(next(t for label, t in step if label == end_label) for end_label in PHASE_ENDS), end]
    spans = {phase: (b - a) * 1e3 for phase, a, b in zip(PHASES, bounds[:-1], bounds[1:], strict=True)}
    return spans | {"step": (end - start) * 1e3}


def guard_check_us(model: torch.nn.Module, x: torch.Tensor) -> float | None:
    """Mean microseconds of one check of the compiled forward's guards (None where dynamo keeps no cache entry or its
    guards fail the call)."""
    try:
        times, _ = guard_check_times(model, x, GUARD_CHECKS)
    except (LookupError, RuntimeError):
        return None
    return statistics.fmean(times)


def timeline(name: str, flat: bool = False) -> dict:
    """The medians of the stamps up to the forward's replay and of the step's phases, and the guards' check, for one
    model (flattened with `flat`)."""
    setup = training_run(name, "reduce-overhead", "cuda", 128, 224, tune_first=True, flat=flat)
    stamp_optimizer(setup.optimizer)
    rows, phases = [], []

    def step(record: bool = False) -> None:
        stamps.clear()
        t0 = time.perf_counter()
        setup.train_step()
        torch.cuda.synchronize()
        end = time.perf_counter()
        if record:
            first = next(i for i, (label, _) in enumerate(stamps) if label == "replay")
            rows.append([(label, (t - t0) * 1e3) for label, t in stamps[: first + 1]])
            phases.append(phases_ms(stamps, t0, end))

    for _ in range(WARMUP):
        step()
    for _ in range(STEPS):
        step(record=True)
    labels = [label for label, _ in rows[0]]
    medians = [statistics.median(r[i][1] for r in rows) for i in range(len(labels))]
    result = {"model": name, "flat": flat, "stamps_ms": dict(zip(labels, medians, strict=True))}
    result["phases_ms"] = {phase: statistics.median(p[phase] for p in phases) for phase in phases[0]}
    result["guard_check_us"] = guard_check_us(setup.net, setup.x)
    result["inputs"] = sum(len(group["params"]) for group in setup.optimizer.param_groups)
    result["inputs"] += sum(1 for _ in setup.model.buffers())
    torch._dynamo.reset()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny", choices=["tiny", "small", "base"])
    parser.add_argument("--flat", action="store_true", help="each model flattened too (lkat_lens.flat_params)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    env = environment()
    out = args.out or dated_result_path(f"host_timeline_{args.size}", env)
    install_stamps()
    rows = []
    for name in (f"vit_{args.size}_patch16_224", f"lkat_{args.size}_patch16_224"):
        for flat in (False, True) if args.flat else (False,):
            rows.append(timeline(name, flat) | env)
            write_result(out, rows)
            print(name, "flattened" if flat else "", f"guards {rows[-1]['guard_check_us']} us")
            for label, ms in (*rows[-1]["stamps_ms"].items(), *rows[-1]["phases_ms"].items()):
                print(f"   {ms:7.3f} ms  {label}")


if __name__ == "__main__":
    main()
