"""Time a training step (forward, backward, AdamW, bf16 autocast) and inference of whole models on a GPU.

    python benchmarks/bench_model.py --models lkat_tiny_patch16_224 vit_tiny_patch16_224 --batch 128

Writes benchmarks/results/bench_model-<gpu>-<date>.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from common import environment  # benchmarks/ is the script folder

import lkat_lens

RESULTS = Path(__file__).parent / "results"


def time_ms(fn, warmup: int, iters: int) -> float:
    """Median milliseconds per call of fn, with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def bench_one(name: str, batch: int, img: int, compile_model: bool, warmup: int, iters: int, **kw) -> dict:
    """Training-step and inference throughput and peak memory of one model."""
    torch.cuda.empty_cache()
    model = lkat_lens.create_model(name, num_classes=1000, img_size=img, **kw).cuda()
    step_model = torch.compile(model) if compile_model else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(batch, 3, img, img, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")

    def train_step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(step_model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            step_model(x)

    model.train()
    torch.cuda.reset_peak_memory_stats()
    train = time_ms(train_step, warmup, iters)
    train_mem = torch.cuda.max_memory_allocated() / 2**30
    model.eval()
    torch.cuda.reset_peak_memory_stats()
    inference = time_ms(infer, warmup, iters)
    infer_mem = torch.cuda.max_memory_allocated() / 2**30
    return {
        "model": name, "kwargs": kw, "batch": batch, "img_size": img, "compile": compile_model,
        "params_M": sum(p.numel() for p in model.parameters()) / 1e6,
        "train_ms": train, "train_img_s": batch / train * 1e3, "train_peak_GiB": train_mem,
        "infer_ms": inference, "infer_img_s": batch / inference * 1e3, "infer_peak_GiB": infer_mem,
        **environment(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["lkat_tiny_patch16_224", "lkat_small_patch16_224",
                                                        "lkat_base_patch16_224"])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = [bench_one(m, args.batch, args.img_size, args.compile, args.warmup, args.iters) for m in args.models]
    env = environment()
    out = args.out or RESULTS / f"bench_model-{env['gpu'].replace(' ', '_')}-{env['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    header = "model | batch | img | compile | train img/s | train peak GiB | infer img/s | GPU | torch | triton | date"
    print(f"| {header} |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['batch']} | {r['img_size']} | {r['compile']} | {r['train_img_s']:.0f} | "
              f"{r['train_peak_GiB']:.2f} | {r['infer_img_s']:.0f} | {r['gpu']} | {r['torch']} | {r['triton']} | "
              f"{r['date']} |")


if __name__ == "__main__":
    main()
