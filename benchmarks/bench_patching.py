"""Activation patching of every block x every position, batched, timed (issue 17).

    python benchmarks/bench_patching.py --model lkat_micro --device cpu [--checkpoint runs/<name>/best.pt]
    python benchmarks/bench_patching.py --model lkat_tiny_patch16_224 --device cuda

Patches the residual stream (resid_pre) of every block at every position from a clean image into its noise
corruption: blocks x tokens forward passes' worth of rows (LKAT-T at 224²: 12 x 201), batched by the sweep's
memory budget. The model is random-init (seeded) unless --checkpoint is given (then a real held-out image). One
untimed warm-up sweep (kernel choice, autotuning), then --repeats timed ones (median). Also times every hook point
(patch_every_point), the four ablations of the heads and DLA + logit lens. Writes
benchmarks/results/patching_<device>.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import date

import torch
from common import device_name, write_result  # benchmarks/ is the script folder

import lkat_lens
from lkat_lens.analyses import interventions as iv


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeats: int) -> tuple[float, object]:
    """Median wall seconds of `repeats` calls (after the caller's warm-up) and the last result."""
    times, result = [], None
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        result = fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lkat_micro")
    parser.add_argument("--checkpoint", help="an lkat-lens checkpoint instead of a random-init --model")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows-per-pass", type=int, help="inputs per forward pass (default: the memory budget's)")
    parser.add_argument("--skip-extras", action="store_true", help="time only the resid_pre sweep")
    parser.add_argument("--out", help="JSON path (default benchmarks/results/patching_<device>.json)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.checkpoint:
        from lkat_lens.data import load_sample

        model, info = lkat_lens.load(args.checkpoint)
        clean = load_sample(info.data, "val", 1).images
        name = info.model_name
    else:
        torch.manual_seed(0)
        model = lkat_lens.create_model(args.model, num_classes=10 if "micro" in args.model else 1000)
        side = model.patch_embed.img_size[0]
        clean = torch.randn(1, 3, side, side, generator=torch.Generator().manual_seed(1))
        name = args.model
    model = model.eval().to(device)
    corrupted = iv.corrupt(clean, "noise", seed=0)
    with torch.no_grad():
        tokens = model.run_with_cache(clean.to(device), names_filter="hook_embed")[1]["hook_embed"].shape[1]
    budget = iv.MEMORY_BUDGET["cuda" if device.type == "cuda" else "cpu"]
    rows = args.rows_per_pass or iv.rows_for_budget(model, tokens, budget)

    def sweep() -> iv.PatchingResult:
        return iv.activation_patching(model, clean, corrupted, "resid_pre", rows_per_pass=rows)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    sweep()
    synchronize(device)
    first = time.perf_counter() - start
    seconds, result = timed(sweep, device, args.repeats)
    row = {
        "model": name,
        "weights": args.checkpoint or "random-init (seeded)",
        "device": device_name(device),
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "blocks": len(result.blocks),
        "positions": len(result.units),
        "patched_runs": len(result.blocks) * len(result.units),
        "rows_per_pass": rows,
        "resid_pre_sweep_s": seconds,
        "first_sweep_s": first,
        "clean_metric": result.clean_metric,
        "corrupt_metric": result.corrupt_metric,
        "torch": torch.__version__,
        "date": date.today().isoformat(),
    }
    if not args.skip_extras:
        row["every_point_s"] = timed(
            lambda: iv.patch_every_point(model, clean, corrupted, rows_per_pass=rows), device, 1
        )[0]
        reference = torch.randn(8, *clean.shape[1:], generator=torch.Generator().manual_seed(2))
        row["ablate_heads_s"] = timed(
            lambda: iv.ablate(model, clean, "heads", reference=reference, rows_per_pass=rows), device, 1
        )[0]
        row["dla_and_logit_lens_s"] = timed(
            lambda: (iv.direct_logit_attribution(model, clean), iv.logit_lens(model, clean)), device, 1
        )[0]
    if device.type == "cuda":
        row["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    print(json.dumps(row, indent=2))
    write_result(args.out or f"benchmarks/results/patching_{device.type}.json", row)


if __name__ == "__main__":
    main()
