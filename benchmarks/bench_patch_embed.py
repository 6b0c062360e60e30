"""Time the patch embedding of a flat ViT on a GPU: timm's convolution (cuDNN's default heuristic, and with
cudnn.benchmark) against `models.patch_embed`'s matmul over the patches.

    python benchmarks/bench_patch_embed.py --out benchmarks/results/bench_patch_embed.json

Per shape (batch, image size, embedding width): the forward, and the forward + backward of the weight and bias (the
images need no gradient), under bf16 autocast as the trainer runs, each replayed as a CUDA graph (the GPU's time),
with the largest difference of the matmul's tokens from the convolution's relative to their largest magnitude.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch
from bench_gla import graphed  # benchmarks/ is the script folder
from bench_model import time_ms
from common import dated_result_path, environment, write_result
from timm.layers import PatchEmbed as TimmPatchEmbed

from lkat_lens.models.patch_embed import PatchEmbed

SHAPES = ((128, 224, 384), (6, 1024, 384), (128, 224, 192), (128, 224, 768))  # LKAT-S, LKAT-S at 1024², T, B


def timings(fn, embed: PatchEmbed, x: torch.Tensor, warmup: int, iters: int) -> dict[str, float]:
    """Graph-replayed ms of fn's forward and of forward + backward (weight and bias gradients) under bf16 autocast."""

    def forward():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            fn(x)

    def forward_backward():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            tokens = fn(x)
        tokens.float().sum().backward()
        embed.proj.weight.grad = embed.proj.bias.grad = None

    return {
        "fwd_ms": time_ms(graphed(forward), warmup, iters),
        "fwd_bwd_ms": time_ms(graphed(forward_backward), warmup, iters),
    }


def measure(batch: int, size: int, dim: int, warmup: int, iters: int) -> dict:
    """The three forms at one shape."""
    embed = PatchEmbed(size, 16, 3, dim).cuda()
    x = torch.randn(batch, 3, size, size, device="cuda")
    row = {"batch": batch, "img_size": size, "dim": dim}
    conv = functools.partial(TimmPatchEmbed.forward, embed)  # timm's own forward: the convolution
    for name, fn, benchmark in (
        ("conv", conv, False),
        ("conv_benchmark", conv, True),
        ("matmul", embed.patch_matmul, False),
    ):
        torch.backends.cudnn.benchmark = benchmark
        row |= {f"{name}_{k}": v for k, v in timings(fn, embed, x, warmup, iters).items()}
    torch.backends.cudnn.benchmark = False
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        want, got = conv(x).float(), embed.patch_matmul(x).float()
    row["matmul_rel_diff"] = ((got - want).abs().max() / want.abs().max()).item()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as the trainer under autocast
    env = environment()
    rows = [{**measure(*shape, args.warmup, args.iters), **env} for shape in SHAPES]
    write_result(args.out or dated_result_path("bench_patch_embed", env), rows)
    print("| batch | size | dim | conv fwd / fwd+bwd ms | conv, cudnn.benchmark | matmul | matmul rel diff |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        forms = [f"{r[f'{n}_fwd_ms']:.3f} / {r[f'{n}_fwd_bwd_ms']:.3f}" for n in ("conv", "conv_benchmark", "matmul")]
        print(f"| {r['batch']} | {r['img_size']} | {r['dim']} | {' | '.join(forms)} | {r['matmul_rel_diff']:.1e} |")


if __name__ == "__main__":
    main()
