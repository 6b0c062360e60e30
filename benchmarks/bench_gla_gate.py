"""Time GLA's forget gate of one LKAT layer from its low-rank code: fused kernels vs the modules, eager and compiled.

    python benchmarks/bench_gla_gate.py --models lkat_tiny_patch16_224 lkat_small_patch16_224 lkat_base_patch16_224

`VisionGLA.forget_gate` of each model's first block, gk = logsigmoid(gk_proj[1](code)) / 16 in fp32 from the gate's
low-rank code (a bf16 column slice of the stacked projection output [B, T, width], as `project` leaves it), at
batch 128: with gate_mode "fused" (`kernels.gla_gate`, one kernel each way; "fused_ieee" with its dot products as
IEEE fp32 products instead of TF32 ones), "torch" eager (the Linear in fp32, TF32 allowed as in training, and
`log_gate`) and "torch" under torch.compile (inductor's GEMM and fusions of the traced form). Every time is a CUDA
graph replay (the GPU's time), forward and forward + backward (gradients of the projection output, of the Linear's
weight and bias). Each row also gets its largest error against the fp64 reference (`gla_gate_reference`) and the
least memory traffic of the gate (forward: gk written in fp32; forward + backward: that and dgk read) as a rate.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from bench_gla import graphed  # benchmarks/ is the script folder
from bench_model import time_ms
from common import dated_result_path, environment, write_result

import lkat_lens
from lkat_lens.kernels import gla_gate

VARIANTS = ("fused", "fused_ieee", "torch", "compiled")


def layer_and_inputs(model: str, batch: int, seed: int = 0):
    """The first block's VisionGLA on the GPU, a bf16 projection output [B, T, width] and an fp32 gradient for gk."""
    lkat = lkat_lens.create_model(model, num_classes=10)
    attn = lkat.blocks[0].attn.cuda()
    tokens = lkat.embed(torch.zeros(1, 3, *lkat.patch_embed.img_size)).shape[1]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    width = sum(m.out_features for m in attn.projections())
    y = torch.randn(batch, tokens, width, device="cuda", generator=gen).to(torch.bfloat16)
    dgk = torch.randn(batch, tokens, attn.gk_proj[1].out_features, device="cuda", generator=gen)
    return attn, y, dgk


def variant(attn, name: str):
    """gk = f(y) for a variant, from the code in y's last columns; "fused_ieee" runs the kernels' dot products as IEEE
    fp32 products instead of TF32 ones (gla_gate.DOT_PRECISION)."""
    attn.gate_mode = "fused" if name.startswith("fused") else "torch"
    rank = attn.gk_proj[1].in_features
    precision = "ieee" if name == "fused_ieee" else gla_gate.DOT_PRECISION

    def gate(y: torch.Tensor) -> torch.Tensor:
        default, gla_gate.DOT_PRECISION = gla_gate.DOT_PRECISION, precision
        try:
            return attn.forget_gate(y[..., -rank:])
        finally:
            gla_gate.DOT_PRECISION = default

    return torch.compile(gate) if name == "compiled" else gate


def timings(fn, attn, y: torch.Tensor, dgk: torch.Tensor, warmup: int, iters: int) -> dict[str, float]:
    """Graph-replayed ms of the forward and of forward + backward."""
    y = y.detach().requires_grad_()
    params = list(attn.gk_proj[1].parameters())

    def forward():
        with torch.no_grad():
            fn(y)

    def forward_backward():
        fn(y).backward(dgk)
        for t in (y, *params):
            t.grad = None

    return {
        "fwd_graph_ms": time_ms(graphed(forward), warmup, iters),
        "fwd_bwd_graph_ms": time_ms(graphed(forward_backward), warmup, iters),
    }


def max_errors(fn, attn, y: torch.Tensor, dgk: torch.Tensor) -> dict[str, float]:
    """max |x - ref| / max |ref| of gk and of the gradients of y, the weight and the bias against the fp64 reference."""
    second, rank = attn.gk_proj[1], attn.gk_proj[1].in_features

    def outputs_and_grads(gk, leaves):
        return [gk.detach(), *torch.autograd.grad(gk, leaves, dgk.to(gk.dtype))]

    leaves = [y.detach().requires_grad_(), second.weight, second.bias]
    got = outputs_and_grads(fn(leaves[0]), leaves)
    exact = [t.detach().double().requires_grad_() for t in leaves]
    reference = gla_gate.gla_gate_reference(exact[0][..., -rank:], exact[1], exact[2], attn.gate_logit_normalizer)
    ref = outputs_and_grads(reference, exact)
    names = ("gk", "dy", "d_weight", "d_bias")
    return {n: ((g.double() - r).abs().max() / r.abs().max()).item() for n, g, r in zip(names, got, ref, strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["lkat_tiny_patch16_224"])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True  # as the trainer and bench_model run: the modules' Linear in TF32
    env, rows = environment(), []
    for model in args.models:
        attn, y, dgk = layer_and_inputs(model, args.batch)
        gk_bytes = 4 * dgk.numel()
        measured = []
        for name in VARIANTS:
            fn = variant(attn, name)
            row = {"variant": name, "model": model, "shape_BTK": list(dgk.shape), "code_dtype": "bfloat16"}
            row |= timings(fn, attn, y, dgk, args.warmup, args.iters)
            row["fwd_min_traffic_TBps"] = gk_bytes / row["fwd_graph_ms"] / 1e9
            row["fwd_bwd_min_traffic_TBps"] = 2 * gk_bytes / row["fwd_bwd_graph_ms"] / 1e9
            row["max_rel_err_vs_fp64"] = max_errors(fn, attn, y, dgk)
            measured.append(row | env)
        for row in measured:
            for key in ("fwd_graph_ms", "fwd_bwd_graph_ms"):
                row[key.replace("_ms", "_x_compiled")] = row[key] / measured[-1][key]
        rows += measured
    write_result(args.out or dated_result_path("bench_gla_gate", env), rows)
    print(f"GLA forget gate of block 0, batch {args.batch}, code bf16 -> gk fp32; CUDA graph replays")
    print("| model | variant | fwd ms | fwd+bwd ms | fwd+bwd × compiled | TB/s (least traffic) | max rel err | GPU |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        err = max(r["max_rel_err_vs_fp64"].values())
        print(
            f"| {r['model']} | {r['variant']} | {r['fwd_graph_ms']:.4f} | {r['fwd_bwd_graph_ms']:.4f} "
            f"| {r['fwd_bwd_graph_x_compiled']:.2f}× | {r['fwd_bwd_min_traffic_TBps']:.2f} | {err:.1e} | {r['gpu']} |"
        )


if __name__ == "__main__":
    main()
