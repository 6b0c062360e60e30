"""GLA's output path as one Triton kernel each way: per-head LayerNorm of o times SiLU of the gate g.

For o and g [N, H, V] (any strides; N = batch x tokens) and the LayerNorm's weight and bias [V]:
    out = (LN(o) * weight + bias) * SiLU(g),   LN(o) = (o - mean) / sqrt(var + eps) per (n, h) row of V channels,
computed in fp32 and stored once in the promoted dtype of o and g. The backward recomputes the row statistics from o
(only o, g and the parameters are saved) and writes do and dg; the weight and bias gradients are summed per program
over its rows and the programs' partials are summed on the host in a fixed order (deterministic, no atomics).

Why, in eager mode: PyTorch's LayerNorm kernel takes one thread block per row, and GLA's rows are one head wide (64
channels, B x T x H of them): on the H200 machine its forward took 4.2 ms and its backward 3.0 ms of an eager LKAT-B
training step's 74.5 ms of kernel time (batch 128; 1.8 ms for the blocks' 25 LayerNorms over 768 channels). Under
torch.compile inductor fuses the modules' expression itself, but into a backward of three kernels (the rows, a
second pass over o, g and the output gradient for the weight and bias, and SiLU's gradient recomputed in the cat of
the projections' gradients): the ops here, which torch.compile keeps as opaque calls, took LKAT-T's compiled training
step from 15.63 to 15.26 ms of kernels and LKAT-S's from 28.82 to 28.07 (H100, batch 128; benchmarks/README.md). So
the model takes this path in both modes (models.attention.VisionGLA.gated_norm). On CUDA the kernels are autotuned
over row tiles and warps; with TRITON_INTERPRET=1 in the environment before triton is first imported they run on CPU
tensors, with a fixed tile.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .autograd_ops import ANY_STRIDES, Kernel, differentiable
from .host_math import cdiv, next_power_of_2
from .tuned import TunedKernel, kernel_table, programs_key, written_through

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_WIDTH = 256
_INTERP_ROWS = 16
# Rows per backward program, whatever its row tile: its weight and bias partials are summed over them before one store,
# and every configuration the autotuner tries launches the same programs, so each writes every partial (a wider tile
# with fewer programs would leave partials of a narrower one's benchmark runs in the buffer).
_BWD_ROWS = 128


def gated_norm_reference(
    o: torch.Tensor, g: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """The exact torch form, in fp32 (fp64 for fp64 operands), returned in the promoted dtype of o and g."""
    dtype = torch.float64 if torch.float64 in (o.dtype, g.dtype) else torch.float32
    normed = torch.nn.functional.layer_norm(o.to(dtype), o.shape[-1:], weight.to(dtype), bias.to(dtype), eps)
    return (normed * torch.nn.functional.silu(g.to(dtype))).to(torch.promote_types(o.dtype, g.dtype))


@triton.jit
def _offsets(strides, r, c, H):
    """Offsets of rows r (flat n * H + h indices) and channels c in an [N, H, V] tensor of these strides."""
    n, h = (r // H).to(tl.int64), r % H
    return n[:, None] * strides[0] + h[:, None] * strides[1] + c[None, :] * strides[2]


@triton.jit
def _rows(ptr, strides, r, c, H, rows, V: tl.constexpr):
    """Rows r (flat n * H + h indices, zero past `rows`) and channels c of an [N, H, V] tensor, as fp32, with the
    mask used."""
    mask = (r < rows)[:, None] & (c < V)[None, :]
    return tl.load(ptr + _offsets(strides, r, c, H), mask=mask, other=0.0).to(tl.float32), mask


@triton.jit
def _normalised(x, mask, eps, V: tl.constexpr):
    """((x - mean) * rstd, rstd) per row of a tile whose masked entries are zero."""
    centred = tl.where(mask, x - (tl.sum(x, axis=1) / V)[:, None], 0.0)
    # in fp32: torch.compile passes a Python float as fp64 (tuned.py)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / V + tl.cast(eps, tl.float32))
    return centred * rstd[:, None], rstd


@triton.jit
def _gated_norm_fwd_kernel(o_ptr, g_ptr, w_ptr, b_ptr, out_ptr, so_n, so_h, so_v, sg_n, sg_h, sg_v, rows, H, eps,
                           programs, V: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr):  # fmt: skip
    """out (contiguous [N, H, V]) of BR rows; `programs` is only the autotuning key. The strides come as integers
    (torch.compile's user-defined kernels take no tuples)."""
    so, sg = (so_n, so_h, so_v), (sg_n, sg_h, sg_v)
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.arange(0, BV)
    x, mask = _rows(o_ptr, so, r, c, H, rows, V)
    gate = _rows(g_ptr, sg, r, c, H, rows, V)[0]
    w = tl.load(w_ptr + c, mask=c < V, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + c, mask=c < V, other=0.0).to(tl.float32)
    xhat = _normalised(x, mask, eps, V)[0]
    out = (xhat * w[None, :] + b[None, :]) * (gate * tl.sigmoid(gate))
    tl.store(out_ptr + r[:, None].to(tl.int64) * V + c[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated_norm_bwd_kernel(o_ptr, g_ptr, w_ptr, b_ptr, dout_ptr, do_ptr, dg_ptr, part_ptr, so_n, so_h, so_v, sg_n,
                           sg_h, sg_v, sd_n, sd_h, sd_v, sdg_n, sdg_h, sdg_v, dg_offset, rows, H, eps, programs,
                           V: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr, ROWS: tl.constexpr):  # fmt: skip
    """do (contiguous [N, H, V]) and dg ([N, H, V] from dg_offset, strides sdg) of ROWS rows in tiles of BR, and this
    program's partial sums of the weight and bias gradients at part_ptr [2, V, launched programs] (partials last: the
    host's sum over them is a contiguous reduction); the argument `programs` is only the autotuning key."""
    so, sg, sd, sdg = (so_n, so_h, so_v), (sg_n, sg_h, sg_v), (sd_n, sd_h, sd_v), (sdg_n, sdg_h, sdg_v)
    dg_ptr += dg_offset
    c = tl.arange(0, BV)
    w = tl.load(w_ptr + c, mask=c < V, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + c, mask=c < V, other=0.0).to(tl.float32)
    dw = tl.zeros((BR, BV), dtype=tl.float32)
    db = tl.zeros((BR, BV), dtype=tl.float32)
    for i in range(ROWS // BR):
        r = tl.program_id(0) * ROWS + i * BR + tl.arange(0, BR)
        x, mask = _rows(o_ptr, so, r, c, H, rows, V)
        gate = _rows(g_ptr, sg, r, c, H, rows, V)[0]
        dout = _rows(dout_ptr, sd, r, c, H, rows, V)[0]
        xhat, rstd = _normalised(x, mask, eps, V)
        y = xhat * w[None, :] + b[None, :]
        s = tl.sigmoid(gate)
        dy = dout * gate * s
        dw += dy * xhat
        db += dy
        dxhat = dy * w[None, :]
        dx = rstd[:, None] * (
            dxhat - (tl.sum(dxhat, axis=1) / V)[:, None] - xhat * (tl.sum(dxhat * xhat, axis=1) / V)[:, None]
        )
        dgate = dout * y * s * (1.0 + gate * (1.0 - s))
        tl.store(do_ptr + r[:, None].to(tl.int64) * V + c[None, :], dx.to(do_ptr.dtype.element_ty), mask=mask)
        tl.store(dg_ptr + _offsets(sdg, r, c, H), dgate.to(dg_ptr.dtype.element_ty), mask=mask)
    launched = tl.num_programs(0)
    part = part_ptr + c * launched + tl.program_id(0)
    tl.store(part, tl.sum(dw, axis=0), mask=c < V)
    tl.store(part + V * launched, tl.sum(db, axis=0), mask=c < V)


_KERNELS = {"forward": _gated_norm_fwd_kernel, "backward": _gated_norm_bwd_kernel}


# (row tile, warps) the autotuner tries: 64-row tiles on 2 warps left out, where the backward spills (255 registers and
# 884 bytes of spill stores for sm_90; every other pair holds its tiles in registers, benchmarks/kernel_registers.py).
_CONFIGS = ((16, 2), (16, 4), (32, 2), (32, 4), (64, 4), (64, 8))


@kernel_table(_KERNELS)
def _autotuned(kernel_name: str) -> TunedKernel:
    """The CUDA kernel autotuned over (row tile, warps), keyed on the width, the head count and the rows
    (tuned.programs_key)."""
    configs = [triton.Config({"BR": br}, num_warps=w) for br, w in _CONFIGS]
    return TunedKernel(triton.autotune(configs=configs, key=["V", "H", "programs"])(_KERNELS[kernel_name]))


def _launch(kernel_name: str, programs, *args, **meta) -> None:
    """Launch over programs(BR) programs: the interpreter with _INTERP_ROWS-row tiles, CUDA autotuned."""
    if INTERPRET:
        _KERNELS[kernel_name][(programs(_INTERP_ROWS),)](*args, **meta, BR=_INTERP_ROWS)
    else:
        _autotuned(kernel_name)[lambda m: (programs(m["BR"]),)](*args, **meta)


def gated_norm_fwd(o, g, weight, bias, eps: float) -> torch.Tensor:
    """out [N, H, V] (contiguous) in the promoted dtype of o and g."""
    N, H, V = o.shape
    out = torch.empty(N, H, V, dtype=torch.promote_types(o.dtype, g.dtype), device=o.device)
    rows = N * H
    if rows:
        meta = dict(V=V, BV=next_power_of_2(V))
        args = (o, g, weight, bias, out, *o.stride(), *g.stride(), rows, H, eps, programs_key(rows))
        _launch("forward", lambda br: cdiv(rows, br), *args, **meta)
    return out


def gated_norm_bwd(
    o,
    g,
    weight,
    bias,
    dout,
    eps: float,
    dg: torch.Tensor | None = None,
    dg_into: tuple[torch.Tensor, int] | None = None,
) -> tuple[torch.Tensor, ...]:
    """(do in o's dtype, dg in g's dtype, d_affine) for the output gradient dout: d_affine [2, V] in fp32 holds the
    weight's gradient, then the bias's. dg is written into `dg` when given (an [N, H, V] tensor of any strides, such
    as a column slice of a wider gradient: pass that gradient and the slice's offset as dg_into,
    tuned.written_through)."""
    N, H, V = o.shape
    rows = N * H
    do = torch.empty(N, H, V, dtype=o.dtype, device=o.device)
    if dg is None:
        dg = torch.empty(N, H, V, dtype=g.dtype, device=o.device)
    if not rows:
        return do, dg, torch.zeros(2, V, dtype=torch.float32, device=o.device)
    programs = cdiv(rows, _BWD_ROWS)
    part = torch.empty(2, V, programs, dtype=torch.float32, device=o.device)
    meta = dict(V=V, BV=next_power_of_2(V), ROWS=_BWD_ROWS)
    target, offset = written_through(dg, dg_into)
    strides = (*o.stride(), *g.stride(), *dout.stride(), *dg.stride(), offset)
    args = (o, g, weight, bias, dout, do, target, part, *strides, rows, H, eps, programs_key(rows))
    _launch("backward", lambda br: programs, *args, **meta)
    return do, dg, part.sum(-1)


# Both ops read o, g and the output gradient through their strides (g is a column slice of the projection output).
@torch.library.custom_op("lkat_lens::gated_norm", mutates_args=(), tags=ANY_STRIDES)
def _gated_norm_op(
    o: torch.Tensor, g: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """The forward as a custom op (opaque to torch.compile)."""
    return gated_norm_fwd(o, g, weight, bias, eps)


@_gated_norm_op.register_fake
def _gated_norm_fake(o, g, weight, bias, eps) -> torch.Tensor:
    return o.new_empty(o.shape, dtype=torch.promote_types(o.dtype, g.dtype))


@torch.library.custom_op("lkat_lens::gated_norm_backward", mutates_args=(), tags=ANY_STRIDES)
def _gated_norm_backward_op(
    o: torch.Tensor, g: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dout: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward as a custom op: (do, dg, d_affine)."""
    return gated_norm_bwd(o, g, weight, bias, dout, eps)


@_gated_norm_backward_op.register_fake
def _gated_norm_backward_fake(o, g, weight, bias, dout, eps):
    return o.new_empty(o.shape), g.new_empty(o.shape), o.new_empty(2, o.shape[-1], dtype=torch.float32)


def _setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    o, g, weight, bias, eps = inputs
    ctx.save_for_backward(o, g, weight, bias)
    ctx.eps = eps


def affine_grads(d_affine: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight's and the bias's gradients, in their dtypes, from gated_norm_bwd's d_affine."""
    return d_affine[0].to(weight.dtype), d_affine[1].to(bias.dtype)


def _backward(ctx, dout: torch.Tensor, kernel) -> tuple:
    o, g, weight, bias = ctx.saved_tensors
    do, dg, d_affine = kernel(o, g, weight, bias, dout, ctx.eps)
    return do, dg, *affine_grads(d_affine, weight, bias), None


_gated_norm = differentiable(
    Kernel(_gated_norm_op, gated_norm_fwd), Kernel(_gated_norm_backward_op, gated_norm_bwd), _backward, _setup_context
)


def supports(o: torch.Tensor, g: torch.Tensor) -> bool:
    """Whether the kernels take these operands: [..., H, V] tensors of one shape in 16/32-bit floats on CUDA (or
    under the interpreter), V at most MAX_WIDTH."""
    return (
        o.shape == g.shape
        and o.dim() >= 2
        and o.shape[-1] <= MAX_WIDTH
        and o.dtype in DTYPES
        and g.dtype in DTYPES
        and (o.is_cuda or INTERPRET)
    )


def gated_norm(o: torch.Tensor, g: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """Differentiable LayerNorm(o) * SiLU(g) per head row of o, g [..., H, V] (weight, bias [V]), returned
    contiguous in the promoted dtype of o and g. Gradients reach o, g, weight and bias."""
    if not supports(o, g) or weight.shape != o.shape[-1:] or bias.shape != o.shape[-1:]:
        raise ValueError(
            f"gated_norm needs o and g of one [..., H, V] shape (V <= {MAX_WIDTH}) in {DTYPES} on CUDA (or the "
            f"Triton interpreter) and weight, bias [V]; got {tuple(o.shape)} {o.dtype}, {tuple(g.shape)} {g.dtype} "
            f"on {o.device}, weight {tuple(weight.shape)}, bias {tuple(bias.shape)}"
        )
    lead, (H, V) = o.shape[:-2], o.shape[-2:]
    return _gated_norm(o.reshape(-1, H, V), g.reshape(-1, H, V), weight, bias, float(eps)).view(*lead, H, V)
