"""How fast the shapes dataset draws images: per process, and through a DataLoader with the trainer's transform.

    python benchmarks/bench_shapes.py [--img-size 224] [--images 400] [--workers 0 8 16]
        [--out benchmarks/results/bench_shapes.json]

Rows: `render` (scene + pixels, PIL image), `train_item` (ds[i] through the shapes recipe's training transform,
what a loader worker does), then a DataLoader at batch 128 for each --workers count (images/s of the whole loader,
the rate a GPU can be fed at; wall time, so other load on the machine slows it: see load_average_1min). Per-process
rows use CPU time, which other load slows less.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from datetime import date

import torch
from common import write_result  # benchmarks/ is the script folder
from torch.utils.data import DataLoader

from lkat_lens import data as lkdata
from lkat_lens import recipe as lkrecipe
from lkat_lens.shapes import ShapesDataset


def per_process(ds: ShapesDataset, images: int, item) -> float:
    """Images per CPU-second of `item(i)` over `images` indices (after one warm-up call)."""
    item(0)
    start = time.process_time()
    for i in range(images):
        item(i)
    return images / (time.process_time() - start)


def loader_rate(ds: ShapesDataset, images: int, workers: int) -> float:
    """Images per wall-second a DataLoader with `workers` processes delivers (first batch excluded)."""
    loader = DataLoader(ds, batch_size=128, num_workers=workers, shuffle=False, persistent_workers=False)
    it = iter(loader)
    next(it)
    start, seen = time.perf_counter(), 0
    for batch, _ in it:
        seen += len(batch)
        if seen >= images:
            break
    return seen / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--images", type=int, default=400)
    p.add_argument("--workers", type=int, nargs="*", default=[0])
    p.add_argument("--out", default="benchmarks/results/bench_shapes.json")
    args = p.parse_args()
    torch.set_num_threads(1)  # as in a DataLoader worker
    mean, std = lkdata.NORMALIZATION["shapes"]
    tf = lkrecipe.build_train_transform(lkrecipe.SHAPES, args.img_size, mean, std)
    ds = ShapesDataset("train", args.img_size, num_images=max(args.images * 4, 1000))
    rows = [
        {"what": "render", "images_per_s": per_process(ds, args.images, ds.image)},
        {"what": "train_item", "images_per_s": per_process(ds, args.images, lambda i: tf(ds.image(i)))},
    ]
    ds.transform = tf
    for workers in args.workers:
        rate = loader_rate(ds, max(args.images, 512) * max(workers, 1), workers)
        rows.append({"what": f"loader_{workers}_workers", "images_per_s": rate})
    env = {"cpu_count": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__}
    env |= {"img_size": args.img_size, "date": date.today().isoformat(), "load_average_1min": os.getloadavg()[0]}
    result = {"environment": env, "rows": rows}
    write_result(args.out, result)
    for row in rows:
        print(f"{row['what']:>20}: {row['images_per_s']:8.0f} images/s")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
