"""The GLA and KAN interventions at transformer scale, timed: the gate-clamp sweep (every head and block, α = 1 and
α = 0), a state-cut sweep, the KAN prune curve over every layer and a symbolic swap of one layer's top edges.

    python benchmarks/bench_interventions_gla_kan.py [--model lkat_base_patch16_224] [--images 64] [--device cuda]
                                                     [--batch-size 64] [--out benchmarks/results/interventions.json]

The model is randomly initialised (seeded) and the images are seeded noise with random labels: the cost depends on
shapes, not on what the weights learned. Prints and writes the wall seconds and peak GPU memory of each step, and
the agreement of the intervened model on CUDA with the exact forms (finite logits, clamps that change them).
"""

from __future__ import annotations

import argparse
import time
from datetime import date

import timm
import torch
from common import device_name, write_result  # benchmarks/ is the script folder

import lkat_lens  # noqa: F401 (registers the models with timm)
from lkat_lens.analyses.batching import full_fp32
from lkat_lens.analyses.interventions import edges, gates
from lkat_lens.analyses.parts import kan_layers
from lkat_lens.study import resolve_device


def timed(step: str, device: torch.device, results: dict, fn):
    """Run fn, record its wall seconds and peak GPU memory under `step`, return its result."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    results[step] = {"seconds": round(time.perf_counter() - start, 3)}
    if device.type == "cuda":
        results[step]["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    print(step, results[step], flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lkat_base_patch16_224")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--device", default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--positions", type=int, default=8, help="state-cut positions (evenly spaced tokens)")
    parser.add_argument("--out", default="benchmarks/results/interventions_gla_kan.json")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    torch.manual_seed(0)
    model = timm.create_model(args.model, num_classes=10).eval().to(device)
    size = model.patch_embed.img_size[0]
    gen = torch.Generator().manual_seed(1)
    images = torch.randn(args.images, 3, size, size, generator=gen)
    labels = torch.randint(0, 10, (args.images,), generator=gen)
    tokens = max(s.stop for s in model.token_layout.values())
    positions = sorted({round(i * (tokens - 1) / args.positions) for i in range(1, args.positions + 1)})
    first_kan = next(iter(kan_layers(model)))
    results: dict = {}
    run = {"images": images, "labels": labels, "batch_size": args.batch_size}
    with full_fp32():
        clamps = timed("gate_clamp_sweep", device, results, lambda: gates.gate_clamp_sweep(model, **run))
        cuts = timed(
            "state_cut_sweep", device, results, lambda: gates.state_cut_sweep(model, positions=positions, **run)
        )
        prune = timed("prune_sweep", device, results, lambda: edges.prune_sweep(model, **run))
        swap = timed("symbolic_swap", device, results, lambda: edges.symbolic_swap(model, layer=first_kan, k=5, **run))
    summary = {
        "clamp_logit_change_finite": bool(torch.isfinite(clamps.head_logit_change).all()),
        "clamp_max_abs_logit_change": float(clamps.head_logit_change.abs().max()),
        "state_cut_logit_change_finite": bool(torch.isfinite(cuts.logit_change).all()),
        "prune_fraction": [round(v, 4) for v in prune.fraction_pruned.tolist()],
        "prune_accuracy_change": prune.accuracy_change.tolist(),
        "swap_logit_abs_change": swap.logit_abs_change,
    }
    print(summary)
    record = {
        "model": args.model,
        "images": args.images,
        "batch_size": args.batch_size,
        "device": device_name(device),
        "date": str(date.today()),
        "torch": torch.__version__,
        "steps": results,
        "summary": summary,
    }
    out = write_result(args.out, record)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
