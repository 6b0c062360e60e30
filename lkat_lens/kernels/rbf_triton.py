"""Triton kernels of the fused RBF grid-linear operator (paper Algorithms 1-2), forward and backward.

x is seen as [rows, D] with a weight [D, G]; the shared form is the same kernel on x viewed as
[numel, 1] with weight [1, G]. Neither pass materialises the [..., G] basis. Centers come in spans
of four: with v = (x - c_a) / h for a span's first center a, psi_j = exp(-v^2) * exp(2v)^j equals
phi_{a+j} * e^{j^2}, so a span costs two exponentials and one multiply per center; the e^{-j^2}
factor is folded into the weights once per program (and into dw when it is stored). The backward
computes dx and dw in one pass: each program keeps one register accumulator per center over its
strided rows and writes a [D, G] partial, which the host sums in a fixed order (deterministic, no
atomics); on request it also writes the forward's output, which it forms on the way (the same products in
the same order as the forward kernel), for a caller that needs it in the backward instead of saving it.
Both passes stride a persistent grid of programs over the rows.

On CUDA the kernels are compiled and autotuned. With TRITON_INTERPRET=1 in the environment before
triton is first imported (triton decorates its own language functions at import), they run through
the Triton interpreter on CPU tensors, with a fixed launch configuration.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from .host_math import cdiv, next_power_of_2
from .tuned import TunedKernel, kernel_table, programs_key

# Centers per pair of exponentials. exp(-v^2) at a span's first center is a normal fp32 number for
# |v| < 9.3, so inside a span of four nothing larger than exp(-(9.3 - 3)^2) ~ e^-40 underflows.
_SPAN: tl.constexpr = tl.constexpr(4)
# v is clamped to [-10, 13]: there every phi of the span is below e^-100, and exp(2v) stays finite.
_CLAMP: tl.constexpr = tl.constexpr(10.0)

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Interpreter launch: small tiles and two row programs, so that masking and the strided loop run.
_INTERP_TILE = 256
_INTERP_ROW_PROGRAMS = 2
# CUDA: programs per SM of the persistent grid (rows are strided over them).
_PROGRAMS_PER_SM = 16
# CUDA backward: channel-tile width (fixes the size of the dw partial buffer).
_BWD_BLOCK_D = 64


@triton.jit
def _decay(j: tl.constexpr):
    """e^{-j^2}: phi_{a+j} = psi_j * e^{-j^2}."""
    return tl.exp(tl.full((1,), -(j * j), tl.float32))


@triton.jit
def _rbf_grid_linear_kernel(
    x_ptr,
    w_ptr,
    dy_ptr,
    out_ptr,
    part_ptr,
    y_ptr,
    n_rows,
    D,
    scale,
    shift,
    dx_scale,
    programs,
    G: tl.constexpr,
    BACKWARD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WRITE_Y: tl.constexpr = False,
):
    """Forward: out = sum_g w[d,g] phi_g(x). Backward: out = dx, part[program] = this program's dw [D, G] and, with
    WRITE_Y, y = the forward's out. `programs` is only the autotuning key."""
    pid_n = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < D
    if BACKWARD:  # weights held in registers across the persistent row loop
        ws = ()  # w[:, g] * e^{-j^2}
        jws = ()  # j * ws[g], for dphi/dx
        dws = ()  # per-center dw accumulators
        for a in tl.static_range(0, G, _SPAN):
            for j in tl.static_range(_SPAN):
                if a + j < G:
                    w = tl.load(w_ptr + cols * G + (a + j), mask=col_ok, other=0.0)[None, :] * _decay(j)
                    ws = ws + (w,)
                    jws = jws + (w * j,)
                    dws = dws + (tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32),)
    for rb in range(pid_n, tl.cdiv(n_rows, BLOCK_N), tl.num_programs(0)):
        rows = rb * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rows < n_rows)[:, None] & col_ok[None, :]
        offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
        u = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32) * scale + shift
        if BACKWARD:
            dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        out = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        y = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)  # the forward's out (backward with WRITE_Y)
        for a in tl.static_range(0, G, _SPAN):
            v = tl.minimum(tl.maximum(u - a, -_CLAMP), _SPAN - 1 + _CLAMP)
            psi = tl.exp(-v * v)
            step = tl.exp(2.0 * v)
            s0 = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
            s1 = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
            for j in tl.static_range(_SPAN):
                if a + j < G:
                    if j > 0:
                        psi = psi * step
                    if BACKWARD:
                        s0 += ws[a + j] * psi
                        if j > 0:
                            s1 += jws[a + j] * psi
                        dws = dws[1:] + (dws[0] + dy * psi,)
                    else:  # forward: one row tile per program mostly, so load at use (fewer live registers)
                        w = tl.load(w_ptr + cols * G + (a + j), mask=col_ok, other=0.0)[None, :] * _decay(j)
                        s0 += w * psi
            if BACKWARD:
                out += v * s0 - s1  # sum_j w_j phi_j (v - j)
                if WRITE_Y:
                    y += s0
            else:
                out += s0
        if BACKWARD:
            out = dy * out * dx_scale
            if WRITE_Y:
                tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)
    if BACKWARD:
        for a in tl.static_range(0, G, _SPAN):
            for j in tl.static_range(_SPAN):
                if a + j < G:
                    dw = tl.sum(dws[a + j], axis=0) * _decay(j)
                    tl.store(part_ptr + pid_n * D * G + cols * G + (a + j), dw, mask=col_ok)


def _forward_configs(channel: bool) -> list[triton.Config]:
    """Autotune candidates of the forward (rows x channels tiles, warps)."""
    tiles = (
        ((4, 256, 8), (8, 128, 4), (16, 128, 4), (8, 256, 4)) if channel else ((1024, 1, 4), (2048, 1, 8), (4096, 1, 8))
    )
    return [triton.Config({"BLOCK_N": n, "BLOCK_D": d}, num_warps=w) for n, d, w in tiles]


# The backward's tiles (rows per tile, warps) for per-channel and shared weights; small tiles keep G accumulators in
# registers. The launcher sizes its partial sums by the smallest row tile.
_BACKWARD_TILES = {True: ((4, 2), (8, 2), (8, 4), (16, 4)), False: ((256, 2), (512, 4), (1024, 8))}


def _backward_configs(channel: bool) -> list[triton.Config]:
    """Autotune candidates of the backward (_BACKWARD_TILES)."""
    return [triton.Config({"BLOCK_N": n}, num_warps=w) for n, w in _BACKWARD_TILES[channel]]


@kernel_table([(backward, channel) for backward in (False, True) for channel in (False, True)])
def _autotuned(backward: bool, channel: bool) -> TunedKernel:
    """The CUDA kernel autotuned over its configurations, keyed on D, G and the rows (tuned.programs_key)."""
    configs = _backward_configs(channel) if backward else _forward_configs(channel)
    return TunedKernel(triton.autotune(configs=configs, key=["D", "G", "programs"])(_rbf_grid_linear_kernel))


@functools.cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def _interp_tile(D: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_D) under the interpreter."""
    block_d = min(next_power_of_2(D), 32)
    return max(1, _INTERP_TILE // block_d), block_d


def require_device(x2d: torch.Tensor, kernels: str = "the Triton RBF kernels") -> None:
    """Refuse tensors `kernels` (this module's, or kan_triton's) cannot run on: they need CUDA (or the interpreter)."""
    if not (x2d.is_cuda or INTERPRET):
        raise RuntimeError(f"{kernels} need CUDA tensors (or TRITON_INTERPRET=1 before importing triton)")


def _prepare(x2d: torch.Tensor, w2d: torch.Tensor, grid_min: float, grid_max: float) -> tuple:
    """Validate operands; return (float32 weight, 1/h, -grid_min/h, -2/h)."""
    require_device(x2d)
    if x2d.dim() != 2 or not x2d.is_contiguous():
        raise ValueError("x must be a contiguous [rows, D] tensor")
    if w2d.dim() != 2 or w2d.shape[0] != x2d.shape[1] or w2d.shape[1] < 2:
        raise ValueError("weight must be [D, G] with G >= 2")
    h = (grid_max - grid_min) / (w2d.shape[1] - 1)
    return w2d.to(device=x2d.device, dtype=torch.float32).contiguous(), 1.0 / h, -grid_min / h, -2.0 / h


def rbf_grid_linear_fwd(
    x2d: torch.Tensor, w2d: torch.Tensor, grid_min: float, grid_max: float, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """y[r, d] = sum_g w2d[d, g] exp(-((x2d[r, d] - c_g) / h)^2), in out_dtype (x2d's dtype unless given: the
    kernel computes in fp32 and rounds once on the store, so a bf16 output costs no separate cast)."""
    w32, scale, shift, dx_scale = _prepare(x2d, w2d, grid_min, grid_max)
    (n_rows, D), G = x2d.shape, w2d.shape[1]
    y = torch.empty_like(x2d, dtype=out_dtype or x2d.dtype)
    if y.numel() == 0:
        return y
    args = (x2d, w32, x2d, y, w32, x2d, n_rows, D, scale, shift, dx_scale, programs_key(n_rows))
    if INTERPRET:
        block_n, block_d = _interp_tile(D)
        launch = (min(cdiv(n_rows, block_n), _INTERP_ROW_PROGRAMS), cdiv(D, block_d))
        _rbf_grid_linear_kernel[launch](*args, G=G, BACKWARD=False, BLOCK_N=block_n, BLOCK_D=block_d)
        return y
    cap = _PROGRAMS_PER_SM * num_sms(x2d.device)

    def grid(m: dict) -> tuple[int, int]:
        d_tiles = cdiv(D, m["BLOCK_D"])
        return max(1, min(cdiv(n_rows, m["BLOCK_N"]), cap // d_tiles)), d_tiles

    _autotuned(False, D > 1)[grid](*args, G=G, BACKWARD=False)
    return y


def rbf_grid_linear_bwd(
    x2d: torch.Tensor,
    w2d: torch.Tensor,
    dy2d: torch.Tensor,
    grid_min: float,
    grid_max: float,
    y_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, ...]:
    """(dx in x2d's dtype, dw float32 [D, G]) for the upstream gradient dy2d, in one pass over x; with y_dtype, also
    the forward's output y in that dtype (as rbf_grid_linear_fwd writes it), from the same pass."""
    w32, scale, shift, dx_scale = _prepare(x2d, w2d, grid_min, grid_max)
    if dy2d.shape != x2d.shape or not dy2d.is_contiguous():
        raise ValueError("dy must be contiguous and shaped like x")
    (n_rows, D), G = x2d.shape, w2d.shape[1]
    dx = torch.empty_like(x2d)
    y = torch.empty_like(x2d, dtype=y_dtype) if y_dtype is not None else None
    if dx.numel() == 0:
        return dx, torch.zeros(D, G, device=x2d.device), *(() if y is None else (y,))
    if INTERPRET:
        block_n, block_d = _interp_tile(D)
        programs = min(cdiv(n_rows, block_n), _INTERP_ROW_PROGRAMS)
    else:
        block_n, block_d = None, (1 if D == 1 else _BWD_BLOCK_D)
        min_block_n = min(n for n, _ in _BACKWARD_TILES[D > 1])
        cap = _PROGRAMS_PER_SM * num_sms(x2d.device) // cdiv(D, block_d)
        programs = max(1, min(cdiv(n_rows, min_block_n), cap))
    part = torch.empty((programs, D, G), device=x2d.device, dtype=torch.float32)
    args = (x2d, w32, dy2d, dx, part, x2d if y is None else y, n_rows, D, scale, shift, dx_scale, programs_key(n_rows))
    launch = (programs, cdiv(D, block_d))
    meta = dict(G=G, BACKWARD=True, BLOCK_D=block_d, WRITE_Y=y is not None)
    if INTERPRET:
        _rbf_grid_linear_kernel[launch](*args, **meta, BLOCK_N=block_n)
    else:
        _autotuned(True, D > 1)[launch](*args, **meta)
    return dx, part.sum(0), *(() if y is None else (y,))
