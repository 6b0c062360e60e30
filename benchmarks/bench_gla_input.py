"""Time GLA's input path (short convolutions + SiLU, q/k RMSNorm, 2D RoPE) of one LKAT layer: fused kernel vs torch.

    python benchmarks/bench_gla_input.py --model lkat_tiny_patch16_224 --out benchmarks/results/bench_gla_input.json

`VisionGLA.inputs` of the model's first block, from its projections' outputs (one [B, T, 2K + 2V + r] GEMM output,
split as the layer splits it) to q, k, v, in bf16 at batch 128: with input_mode "fused" (`kernels.gla_input`, one
kernel per q, k, v), "torch" eager (the modules: Conv1d, RmsNorm, RoPE), and "torch" under torch.compile (inductor's
fusion of the traced form). Every time is a CUDA graph replay (the GPU's time), forward and forward + backward
(gradients of the projection output and of the conv and norm weights). Each row also gets its largest error
against the fp64 reference (`gla_input_reference`, on the same inputs) and the minimum memory traffic of the path
(read x, write q, k, v; the backward also reads the gradients and x and writes dx) as a fraction of the time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from bench_gla import graphed  # benchmarks/ is the script folder
from bench_model import time_ms
from common import dated_result_path, environment, write_result

import lkat_lens
from lkat_lens.kernels.gla_input import gla_input_reference


def layer_and_inputs(model: str, batch: int, seed: int = 0):
    """The first block's VisionGLA on the GPU, a bf16 projection output [B, T, width] split as `project` splits it,
    and bf16 gradients for q, k, v."""
    lkat = lkat_lens.create_model(model, num_classes=10)
    attn = lkat.blocks[0].attn.cuda()
    linears = attn.projections()
    tokens = lkat.embed(torch.zeros(1, 3, *lkat.patch_embed.img_size)).shape[1]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    width = sum(m.out_features for m in linears)
    y = torch.randn(batch, tokens, width, device="cuda", generator=gen).to(torch.bfloat16)
    heads = attn.num_heads
    grads = [
        torch.randn(batch, tokens, heads, d, device="cuda", generator=gen).to(torch.bfloat16)
        for d in (attn.head_dim, attn.head_dim, attn.head_v_dim)
    ]
    return attn, [m.out_features for m in linears], y, grads


def variant(attn, sizes: list[int], name: str):
    """(q, k, v) = f(y) under bf16 autocast for a variant: "fused", "torch" or "compiled"."""
    attn.input_mode = "fused" if name == "fused" else "torch"

    def inputs(y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v = y.split(sizes, dim=-1)[:3]
        with torch.autocast(y.device.type, dtype=torch.bfloat16):  # as the layer runs in training
            return attn.inputs(q, k, v)

    return torch.compile(inputs) if name == "compiled" else inputs


def timings(fn, attn, y: torch.Tensor, grads: list[torch.Tensor], warmup: int, iters: int) -> dict[str, float]:
    """Graph-replayed ms of the forward and of forward + backward."""
    y = y.detach().requires_grad_()
    params = [p for m in attn.input_modules() for p in m.parameters()]

    def forward():
        with torch.no_grad():
            fn(y)

    def forward_backward():
        torch.autograd.backward(fn(y), grads)
        for t in (y, *params):
            t.grad = None

    return {
        "fwd_graph_ms": time_ms(graphed(forward), warmup, iters),
        "fwd_bwd_graph_ms": time_ms(graphed(forward_backward), warmup, iters),
    }


def max_errors(fn, attn, y: torch.Tensor, grads: list[torch.Tensor], sizes: list[int]) -> dict[str, float]:
    """max |x - ref| / max |ref| of q, k, v and of the gradients of y and of the conv and norm weights against the
    fp64 reference (`gla_input_reference` of each of q, k, v, with fp64 copies of the layer's weights)."""
    params = [attn.q_conv1d.weight, attn.k_conv1d.weight, attn.v_conv1d.weight, attn.q_norm.weight, attn.k_norm.weight]
    cos, sin = (t.double() for t in attn.rotary.channel_tables(y.shape[1]))
    H = attn.num_heads

    def reference(y, qw, kw, vw, qn, kn):
        q, k, v = y.split(sizes, dim=-1)[:3]
        return (
            gla_input_reference(q, qw, qn, cos, sin, H, attn.q_norm.eps),
            gla_input_reference(k, kw, kn, cos, sin, H, attn.k_norm.eps),
            gla_input_reference(v, vw, None, None, None, H, 0.0),
        )

    def outputs_and_grads(outs, leaves):
        gradients = torch.autograd.grad(outs, leaves, [g.to(o.dtype) for g, o in zip(grads, outs, strict=True)])
        return [o.detach() for o in outs] + list(gradients)

    y = y.detach().requires_grad_()
    got = outputs_and_grads(fn(y), [y, *params])
    leaves = [t.detach().double().requires_grad_() for t in (y, *params)]
    ref = outputs_and_grads(reference(*leaves), leaves)
    names = ("q", "k", "v", "dy", "d_q_conv", "d_k_conv", "d_v_conv", "d_q_norm", "d_k_norm")
    return {n: ((g.double() - r).abs().max() / r.abs().max()).item() for n, g, r in zip(names, got, ref, strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lkat_tiny_patch16_224")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    attn, sizes, y, grads = layer_and_inputs(args.model, args.batch)
    moved = 2 * sum(g.numel() for g in grads)  # bf16 bytes: x read and q, k, v written, once each
    rows = []
    for name in ("fused", "torch", "compiled"):
        fn = variant(attn, sizes, name)
        row = {"variant": name, "model": args.model, "shape_BT_width": list(y.shape), "dtype": "bfloat16"}
        row |= timings(fn, attn, y, grads, args.warmup, args.iters)
        row["fwd_min_traffic_TBps"] = 2 * moved / row["fwd_graph_ms"] / 1e9
        row["max_rel_err_vs_fp64"] = max_errors(fn, attn, y, grads, sizes)
        rows.append(row)
    env = environment()
    for row in rows:
        for key in ("fwd_graph_ms", "fwd_bwd_graph_ms"):
            row[key.replace("_ms", "_x_compiled")] = row[key] / rows[-1][key]
        row.update(env)
    write_result(args.out or dated_result_path("bench_gla_input", env), rows)
    print(f"GLA input path of {args.model} block 0, projection output {list(y.shape)} bf16; CUDA graph replays")
    print(
        "| variant | fwd ms | fwd+bwd ms | fwd × compiled | fwd+bwd × compiled | fwd TB/s (min traffic) "
        "| max rel err | GPU |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        err = max(r["max_rel_err_vs_fp64"].values())
        print(
            f"| {r['variant']} | {r['fwd_graph_ms']:.3f} | {r['fwd_bwd_graph_ms']:.3f} "
            f"| {r['fwd_graph_x_compiled']:.2f}× | {r['fwd_bwd_graph_x_compiled']:.2f}× "
            f"| {r['fwd_min_traffic_TBps']:.2f} | {err:.1e} | {r['gpu']} |"
        )


if __name__ == "__main__":
    main()
