"""The short GLA kernels' register budget on a GPU: each of their kernels compiled for 4 and 8 warps, uncapped and
capped (Triton's maxnreg 168, 128, 96), with its registers, spills and shared memory, its time replayed as a CUDA
graph and its largest difference from the autotuned kernel, at LKAT-T's and LKAT-S's training shapes.

    python benchmarks/bench_gla_registers.py --out benchmarks/results/bench_gla_registers.json

It is how the forward's register cap in kernels/gla_short.py was found (benchmarks/README.md, GLA sublayer).
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from bench_gla import graphed  # benchmarks/ is the script folder
from bench_model import time_ms
from common import dated_result_path, environment, write_result

from lkat_lens.kernels import gla_short

CAPS = (None, 168, 128, 96)


def _cap(cap: int | None) -> dict:
    """The launch option of a register cap (none: Triton's default)."""
    return {} if cap is None else {"maxnreg": cap}


def forward(q, k, v, gk, warps: int, cap: int | None):
    """The forward's walk kernel at one (warps, register cap), V tile 64, after the autotuned intra-chunk kernel:
    ((o,), compiled walk kernel)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    o = torch.empty(B, T, H, V, dtype=q.dtype, device=q.device)
    oa = torch.empty(o.shape, dtype=torch.float32, device=q.device)
    strides = (q.stride(), k.stride(), v.stride(), gk.stride(), o.stride())
    meta = dict(K=K, V=V, PRECISION="tf32")
    gla_short._kernel("fwd_intra", V)[(B * H, triton.cdiv(T, 16))](q, k, v, gk, oa, *strides, T, H, K**-0.5, **meta)
    rows = triton.cdiv(T, 16) * 16
    compiled = gla_short._gla_short_fwd_kernel[(B * H, 1, 1)](
        q, k, v, gk, o, oa, oa, *strides, T, H, K**-0.5, rows, B * H, **meta, BV=V, SEGMENTED=False,
        num_warps=warps, num_stages=1, **_cap(cap),
    )  # fmt: skip
    return (o,), compiled


def backward(q, k, v, gk, do, warps: int, cap: int | None):
    """The backward kernel at one (warps, register cap): ((dq, dk, dv, dg), compiled kernel)."""
    B, T, H, K = q.shape
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dg = torch.empty(gk.shape, dtype=torch.float32, device=q.device)
    strides = (q.stride(), k.stride(), v.stride(), gk.stride(), do.stride(), dg.stride(), dv.stride())
    compiled = gla_short._gla_short_bwd_kernel[(B * H, 1)](
        q, k, v, gk, do, dq, dk, dv, dg, dg, dg, *strides, T, H, K**-0.5, triton.cdiv(T, 16) * 16, B * H, K=K,
        V=v.shape[-1], PRECISION="tf32", SEGMENTED=False, num_warps=warps, num_stages=1, **_cap(cap),
    )  # fmt: skip
    return (dq, dk, dv, dg), compiled


def largest_difference(got: tuple[torch.Tensor, ...], ref: tuple[torch.Tensor, ...]) -> float:
    """max |got - ref| / max |ref| over the outputs."""
    pairs = zip(got, ref, strict=True)
    return max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item() for a, b in pairs)


def measure(batch: int, tokens: int, heads: int, head_dim: int, warmup: int, iters: int) -> list[dict]:
    """Rows of every (kernel, warps, cap) at one shape, and the autotuned kernels' own times."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (batch, tokens, heads, head_dim)
    q, k, v, do = (torch.randn(shape, device="cuda", generator=gen).bfloat16() for _ in range(4))
    gk = F.logsigmoid(torch.randn(q.shape, device="cuda", generator=gen)) / 16
    scale = head_dim**-0.5
    ref_o = gla_short.gla_short_fwd(q, k, v, gk, scale, 0)[:1]
    ref_grads = gla_short.gla_short_bwd(q, k, v, gk, ref_o[0].new_empty(0), do, scale, 0)
    rows = [
        {"shape_BTHD": shape, "kernel": "forward", "config": "autotuned",
         "ms": time_ms(graphed(lambda: gla_short.gla_short_fwd(q, k, v, gk, scale, 0)), warmup, iters)},
        {"shape_BTHD": shape, "kernel": "backward", "config": "autotuned",
         "ms": time_ms(graphed(lambda: gla_short.gla_short_bwd(q, k, v, gk, ref_o[0].new_empty(0), do, scale, 0)),
                       warmup, iters)},
    ]  # fmt: skip
    for warps in (4, 8):
        for cap in CAPS:
            for kernel in ("forward", "backward"):
                if kernel == "forward":
                    run, ref = functools.partial(forward, q, k, v, gk, warps, cap), ref_o
                else:
                    run, ref = functools.partial(backward, q, k, v, gk, do, warps, cap), ref_grads
                outputs, compiled = run()
                row = {"shape_BTHD": shape, "kernel": kernel, "num_warps": warps, "maxnreg": cap}
                row |= {"regs": compiled.n_regs, "spills": compiled.n_spills, "shared": compiled.metadata.shared}
                row |= {"ms": time_ms(graphed(run), warmup, iters), "max_rel_diff": largest_difference(outputs, ref)}
                rows.append(row)
                print(row, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=201)
    parser.add_argument("--heads", nargs="+", type=int, default=[3, 6], help="3: LKAT-T, 6: LKAT-S")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    env = environment()
    out = args.out or dated_result_path("bench_gla_registers", env)
    rows = []
    for heads in args.heads:
        rows += [{**r, **env} for r in measure(args.batch, args.tokens, heads, 64, args.warmup, args.iters)]
        write_result(out, rows)


if __name__ == "__main__":
    main()
