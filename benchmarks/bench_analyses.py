"""Every analysis of `lkat-lens analyze` and the figures of `lkat-lens figures` on a model, timed.

    python benchmarks/bench_analyses.py [--model lkat_base_patch16_224] [--images 5000] [--device cuda]
                                        [--batch-size 64] [--out benchmarks/results/analyses.json]
    python benchmarks/bench_analyses.py --checkpoint lkat_t.pt --images 256 --device cpu --no-figures \
                                        [--noise | --data NAME --data-dir DIR]

Without --checkpoint the model is randomly initialised (seeded) and the images are seeded noise at the model's
input size: the cost of an analysis depends on shapes, not on what the weights learned. With --checkpoint the
model is that checkpoint's, studied as `lkat-lens analyze` does, on its own data (or --data/--data-dir, or seeded
noise at its input size with --noise, for a machine without the data set). The statistics stream over `--images`
in batches of `--batch-size`; attributions and probes take their own samples (the `analyze` defaults: 4 and 256).
Prints and writes the wall seconds of each step, the whole report, the figures of every block and the peak GPU
memory.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path

import timm
import torch
from common import device_name, write_result  # benchmarks/ is the script folder
from tqdm.auto import tqdm

import lkat_lens  # noqa: F401 (registers the models with timm)
from lkat_lens import figures_cli, report
from lkat_lens.checkpoint import CheckpointInfo
from lkat_lens.data import Sample
from lkat_lens.figures.export import write_figures
from lkat_lens.study import Study, StudyDefaults, resolve_device


def random_sample(n: int, size: int, classes: int, seed: int) -> Sample:
    """Seeded noise images [n, 3, size, size] and labels."""
    gen = torch.Generator().manual_seed(seed)
    return Sample(torch.randn(n, 3, size, size, generator=gen), torch.randint(0, classes, (n,), generator=gen))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_edge_statistics(study: Study, images: int, device: torch.device) -> None:
    """torch.profiler's table of the edge statistics (the slowest step) on the first `images` images."""
    from torch.profiler import ProfilerActivity, profile

    from lkat_lens.analyses import edge_functions

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        edge_functions.layer_statistics(study.model, study.sample.images[:images], batch_size=study.defaults.batch_size)
        synchronize(device)
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=25))


def random_study(args: argparse.Namespace, device: torch.device, defaults: StudyDefaults) -> Study:
    """A seeded random-init `--model` on seeded noise images."""
    torch.manual_seed(0)
    model = timm.create_model(args.model, num_classes=args.classes).eval()
    size = model.patch_embed.img_size[0]
    info = CheckpointInfo(
        "random-init", args.model, {}, data={"name": "noise", "img_size": size, "mean": [0.5] * 3, "std": [0.25] * 3}
    )
    study = Study(model, info, defaults=defaults, device=device)
    use_noise(study, args.classes)
    return study


def use_noise(study: Study, classes: int) -> None:
    """Seeded noise images at the model's input size as the study's sample and probe training images."""
    size = study.model.patch_embed.img_size[0]
    study.sample = random_sample(study.defaults.num_images, size, classes, seed=1)
    study.probe_train = random_sample(study.defaults.probe_images, size, classes, seed=2)


def checkpoint_study(args: argparse.Namespace, device: torch.device, defaults: StudyDefaults) -> Study:
    """The checkpoint's model, studied as `lkat-lens analyze` does (its data, --data/--data-dir, or --noise)."""
    torch.manual_seed(0)
    study = Study.open(args.checkpoint, data=args.data, data_dir=args.data_dir, device=device, progress=False)
    study.defaults = defaults
    if args.noise:
        use_noise(study, len(study.class_names) or args.classes)
    return study


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lkat_base_patch16_224", help="the random-init model (no --checkpoint)")
    parser.add_argument("--checkpoint", help="a lkat-lens checkpoint to study instead of a random-init --model")
    parser.add_argument("--data", help="with --checkpoint: its dataset (default: the checkpoint's)")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--noise", action="store_true", help="with --checkpoint: seeded noise instead of its data")
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--probe-images", type=int, default=StudyDefaults.probe_images)
    parser.add_argument("--attribution-images", type=int, default=StudyDefaults.attribution_images)
    parser.add_argument("--device", default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--figures", action=argparse.BooleanOptionalAction, default=True, help="time the figures too")
    parser.add_argument("--out", default="benchmarks/results/analyses.json")
    parser.add_argument("--profile", type=int, default=0, help="also profile the edge statistics on this many images")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    defaults = StudyDefaults(
        num_images=args.images,
        batch_size=args.batch_size,
        probe_images=args.probe_images,
        attribution_images=args.attribution_images,
    )
    study = checkpoint_study(args, device, defaults) if args.checkpoint else random_study(args, device, defaults)
    begun = time.perf_counter()
    study.sample, study.probe_train  # noqa: B018 (loaded before the timings)
    loading = time.perf_counter() - begun
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    rows: dict[str, float] = {}
    peaks: dict[str, float] = {}
    start = time.perf_counter()
    for key, (step, job) in report.analyses_for(study).items():
        begun = time.perf_counter()
        job()
        synchronize(device)
        rows[key] = time.perf_counter() - begun
        if device.type == "cuda":
            peaks[key] = torch.cuda.max_memory_allocated(device) / 2**30
            torch.cuda.reset_peak_memory_stats(device)
        print(f"{step}: {rows[key]:.1f} s, peak {peaks.get(key, 0):.1f} GiB", flush=True)
    rows["analyze_total"] = time.perf_counter() - start
    rows["loading_the_sample"] = loading
    if args.figures:
        begun = time.perf_counter()
        blocks = range(study.num_blocks)
        figs = {
            **figures_cli.edge_figures(study, blocks, tqdm(disable=True)),
            **figures_cli.analysis_figures(study, tqdm(disable=True)),
        }
        html = Path("/tmp/bench_figures")
        write_figures(figs, html, "html")
        rows["figures_all_blocks_html"] = time.perf_counter() - begun
    peak = max(peaks.values()) if peaks else None
    model = f"{args.checkpoint} ({study.info.model_name})" if args.checkpoint else f"{args.model} (random init, seeded)"
    result = {
        "model": model,
        "data": "seeded noise" if args.noise or not args.checkpoint else (args.data or study.info.data.get("name")),
        "images": args.images,
        "probe_images": args.probe_images,
        "attribution_images": args.attribution_images,
        "threads": torch.get_num_threads(),
        "batch_size": args.batch_size,
        "device": device_name(device),
        "torch": torch.__version__,
        "date": date.today().isoformat(),
        "seconds": rows,
        "peak_gpu_memory_gib": peak,
        "peak_gpu_memory_gib_by_step": peaks,
    }
    print(json.dumps(result, indent=1))
    if args.profile:
        profile_edge_statistics(study, args.profile, device)
    write_result(args.out, result, indent=1)


if __name__ == "__main__":
    main()
