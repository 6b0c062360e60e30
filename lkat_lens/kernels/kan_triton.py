"""Triton kernels of the whole RBF-KAN layer fused into its matmuls, forward and backward.

Shared / channel basis, x [M, K], grid weights w [K, G] (the shared form passes one row with stride 0),
W [N, K]: y = psi(x) W^T with psi(x)[r, k] = sum_g w[k, g] phi_g(x[r, k]). psi is evaluated on the A tile
as it is loaded (prologue), so it never reaches HBM. The backward computes dpsi = dy W with
dx = dpsi * psi'(x) and this tile's share of dw[k, g] = sum_r dpsi[r, k] phi_g(x[r, k]) in the epilogue
(a [row blocks, K, G] partial the host sums in a fixed order), and dW = dy^T psi(x) with psi again
recomputed on the operand load.

Edge basis (FastKAN), W [N, K*G] with column p*G + g: y = Phi(x) W^T with Phi(x)[r, p*G + g] = phi_g(x[r, p]).
The K loop walks (channel block, span of four centers) and generates the four basis tiles from one x
tile, so [M, K*G] never exists. W is read through its [N, G, K] permutation (contiguous channel
blocks per center). dx = sum_g (dy W)[:, p, g] phi_g'(x[:, p]) is contracted over g in the epilogue;
dW = dy^T Phi(x) keeps one accumulator per center of a span.

Centers use the span identity of rbf_triton: with v = u - a for a span's first center a,
phi_{a+j} = exp(-v^2) * exp(2v)^j * e^{-j^2}: two exponentials per span of four centers.
u = (x - grid_min) / h; matmul operands are in W's dtype, accumulation in fp32.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .rbf import check_grid
from .rbf_triton import INTERPRET

_SPAN: tl.constexpr = tl.constexpr(4)
# v is clamped to [-10, 13]: there every phi of the span is below e^-100 and exp(2v) stays finite.
_CLAMP: tl.constexpr = tl.constexpr(10.0)
# |u - g| beyond this gives phi_g == 0 exactly; clamping keeps t * phi_g finite for huge x.
_T_MAX: tl.constexpr = tl.constexpr(40.0)
_GROUP_M = 8
# Under the interpreter: one small tile shape, so that masking and every loop run on tiny inputs.
_INTERP_META = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}


@triton.jit
def _decay(j: tl.constexpr):
    """e^{-j^2}: phi_{a+j} = exp(-v^2) exp(2v)^j e^{-j^2}."""
    return tl.exp(tl.full((1,), -(j * j), tl.float32))


@triton.jit
def _span_start(u, a):
    """(v, exp(-v^2), exp(2v)) for the span of centers a..a+3, v = u - a clamped."""
    v = tl.minimum(tl.maximum(u - a, -_CLAMP), _SPAN - 1 + _CLAMP)
    return v, tl.exp(-v * v), tl.exp(2.0 * v)


@triton.jit
def _mma(a, b, acc, DOT: tl.constexpr):
    """acc + a @ b. DOT "emulate" (interpreter, whose dot misreads bf16): the same product on fp32 copies."""
    if DOT == "emulate":
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc, input_precision=DOT)
    return out


@triton.jit
def _tile_ids(pid, rows_total, cols_total, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, GROUP_M: tl.constexpr):
    """(row block, column block) of a program, grouped GROUP_M row blocks at a time for L2 reuse."""
    num_r = tl.cdiv(rows_total, BLOCK_R)
    num_c = tl.cdiv(cols_total, BLOCK_C)
    width = GROUP_M * num_c
    first = (pid // width) * GROUP_M
    size = tl.minimum(num_r - first, GROUP_M)
    return first + (pid % width) % size, (pid % width) // size


@triton.jit
def _psi(u, gw_ptr, cols, col_ok, stride_gw, G: tl.constexpr):
    """psi = sum_g w[col, g] phi_g on a [rows, cols] tile of u, in fp32 (0 on masked columns)."""
    out = tl.zeros_like(u)
    for a in tl.static_range(0, G, _SPAN):
        v, psi, step = _span_start(u, a)
        for j in tl.static_range(_SPAN):
            if a + j < G:
                if j > 0:
                    psi = psi * step
                w = tl.load(gw_ptr + cols * stride_gw + (a + j), mask=col_ok, other=0.0) * _decay(j)
                out += w[None, :] * psi
    return out


@triton.jit
def _kan_fwd_kernel(
    x_ptr, gw_ptr, w_ptr, y_ptr, M, N, K,
    stride_xm, stride_xk, stride_gw, stride_wn, stride_wk, stride_ym, stride_yn,
    scale, shift,
    G: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """y = psi(x) W^T with psi computed on the A tile."""
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    outs = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, out_ok = rows < M, outs < N
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        x = tl.load(x_rows + cols[None, :] * stride_xk, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        psi = _psi(x.to(tl.float32) * scale + shift, gw_ptr, cols, col_ok, stride_gw, G)
        w_tile = w_ptr + outs[None, :] * stride_wn + cols[:, None] * stride_wk
        b = tl.load(w_tile, mask=col_ok[:, None] & out_ok[None, :], other=0.0)
        acc = _mma(psi.to(b.dtype), b, acc, DOT)
    y_tile = y_ptr + rows.to(tl.int64)[:, None] * stride_ym + outs[None, :] * stride_yn
    tl.store(y_tile, acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & out_ok[None, :])


@triton.jit
def _kan_bwd_dx_kernel(
    x_ptr, gw_ptr, w_ptr, dy_ptr, dx_ptr, part_ptr, M, N, K,
    stride_xm, stride_xk, stride_gw, stride_wn, stride_wk, stride_dym, stride_dyn, stride_dxm, stride_dxk,
    scale, shift, dx_scale,
    G: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """dpsi = dy W on a [BLOCK_M, BLOCK_K] tile; epilogue: dx = dpsi psi'(x), part[row block] = dw share."""
    pid_m, pid_k = _tile_ids(tl.program_id(0), M, K, BLOCK_M, BLOCK_K, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    row_ok, col_ok = rows < M, cols < K
    dy_rows = dy_ptr + rows.to(tl.int64)[:, None] * stride_dym
    dpsi = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        outs = n0 + tl.arange(0, BLOCK_N)
        out_ok = outs < N
        dy = tl.load(dy_rows + outs[None, :] * stride_dyn, mask=row_ok[:, None] & out_ok[None, :], other=0.0)
        w_tile = w_ptr + outs[:, None] * stride_wn + cols[None, :] * stride_wk
        w = tl.load(w_tile, mask=out_ok[:, None] & col_ok[None, :], other=0.0)
        dpsi = _mma(dy, w, dpsi, DOT)
    mask = row_ok[:, None] & col_ok[None, :]
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :] * stride_xk, mask=mask, other=0.0)
    u = x.to(tl.float32) * scale + shift
    deriv = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)  # sum_g w_g phi_g (u - g)
    part_row = part_ptr + pid_m.to(tl.int64) * K * G + cols * G
    for a in tl.static_range(0, G, _SPAN):
        v, psi, step = _span_start(u, a)
        for j in tl.static_range(_SPAN):
            if a + j < G:
                if j > 0:
                    psi = psi * step
                w = tl.load(gw_ptr + cols * stride_gw + (a + j), mask=col_ok, other=0.0) * _decay(j)
                deriv += w[None, :] * psi * (v - j)
                tl.store(part_row + (a + j), tl.sum(dpsi * psi, axis=0) * _decay(j), mask=col_ok)
    dx = dpsi * deriv * dx_scale
    dx_tile = dx_ptr + rows.to(tl.int64)[:, None] * stride_dxm + cols[None, :] * stride_dxk
    tl.store(dx_tile, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _kan_bwd_dw_kernel(
    x_ptr, gw_ptr, dy_ptr, dw_ptr, M, N, K,
    stride_xm, stride_xk, stride_gw, stride_dym, stride_dyn, stride_dwn, stride_dwk,
    scale, shift,
    G: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """dW = dy^T psi(x) with psi computed on the B tile; the loop runs over rows."""
    pid_n, pid_k = _tile_ids(tl.program_id(0), N, K, BLOCK_N, BLOCK_K, GROUP_M)
    outs = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    out_ok, col_ok = outs < N, cols < K
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for m0 in range(0, M, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        dy_tile = dy_ptr + rows.to(tl.int64)[None, :] * stride_dym + outs[:, None] * stride_dyn
        dy_t = tl.load(dy_tile, mask=out_ok[:, None] & row_ok[None, :], other=0.0)
        x_tile = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :] * stride_xk
        x = tl.load(x_tile, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        psi = _psi(x.to(tl.float32) * scale + shift, gw_ptr, cols, col_ok, stride_gw, G)
        acc = _mma(dy_t, psi.to(dy_t.dtype), acc, DOT)
    dw_tile = dw_ptr + outs[:, None] * stride_dwn + cols[None, :] * stride_dwk
    tl.store(dw_tile, acc.to(dw_ptr.dtype.element_ty), mask=out_ok[:, None] & col_ok[None, :])


@triton.jit
def _edge_fwd_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wg, stride_wk, stride_ym, stride_yn,
    scale, shift,
    G: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """y = Phi(x) W^T; each step turns one x tile into the basis tiles of four centers (W as [N, G, K])."""
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    outs = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, out_ok = rows < M, outs < N
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    spans = (G + _SPAN - 1) // _SPAN
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step_id in range(0, tl.cdiv(K, BLOCK_K) * spans):
        a = (step_id % spans) * _SPAN
        cols = (step_id // spans) * BLOCK_K + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        x = tl.load(x_rows + cols[None, :] * stride_xk, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        _, psi, step = _span_start(x.to(tl.float32) * scale + shift, a)
        for j in tl.static_range(_SPAN):
            if j > 0:
                psi = psi * step
            w_tile = w_ptr + outs[None, :] * stride_wn + (a + j) * stride_wg + cols[:, None] * stride_wk
            b = tl.load(w_tile, mask=(col_ok[:, None] & out_ok[None, :]) & (a + j < G), other=0.0)
            acc = _mma((psi * _decay(j)).to(b.dtype), b, acc, DOT)
    y_tile = y_ptr + rows.to(tl.int64)[:, None] * stride_ym + outs[None, :] * stride_yn
    tl.store(y_tile, acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & out_ok[None, :])


@triton.jit
def _edge_bwd_dx_kernel(
    x_ptr, w_ptr, dy_ptr, dx_ptr, M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wg, stride_wk, stride_dym, stride_dyn, stride_dxm, stride_dxk,
    scale, shift, dx_scale,
    G: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """dx[:, p] = sum_g (dy W)[:, p, g] phi_g'(x[:, p]): one dy W tile per center, contracted in registers."""
    pid_m, pid_k = _tile_ids(tl.program_id(0), M, K, BLOCK_M, BLOCK_K, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    row_ok, col_ok = rows < M, cols < K
    mask = row_ok[:, None] & col_ok[None, :]
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :] * stride_xk, mask=mask, other=0.0)
    u = x.to(tl.float32) * scale + shift
    dy_rows = dy_ptr + rows.to(tl.int64)[:, None] * stride_dym
    dx = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for g in range(G):
        dphi = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        for n0 in range(0, N, BLOCK_N):
            outs = n0 + tl.arange(0, BLOCK_N)
            out_ok = outs < N
            dy = tl.load(dy_rows + outs[None, :] * stride_dyn, mask=row_ok[:, None] & out_ok[None, :], other=0.0)
            w_tile = w_ptr + outs[:, None] * stride_wn + g * stride_wg + cols[None, :] * stride_wk
            w = tl.load(w_tile, mask=out_ok[:, None] & col_ok[None, :], other=0.0)
            dphi = _mma(dy, w, dphi, DOT)
        t = tl.minimum(tl.maximum(u - g, -_T_MAX), _T_MAX)
        dx += dphi * t * tl.exp(-t * t)
    dx_tile = dx_ptr + rows.to(tl.int64)[:, None] * stride_dxm + cols[None, :] * stride_dxk
    tl.store(dx_tile, (dx * dx_scale).to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _edge_bwd_dw_kernel(
    x_ptr, dy_ptr, dw_ptr, M, N, K,
    stride_xm, stride_xk, stride_dym, stride_dyn, stride_dwn, stride_dwk,
    scale, shift,
    G: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """dW[:, p*G + g] = dy^T phi_g(x[:, p]) for the four centers of span program_id(1), stored in W's layout."""
    pid_n, pid_k = _tile_ids(tl.program_id(0), N, K, BLOCK_N, BLOCK_K, GROUP_M)
    a = tl.program_id(1) * _SPAN
    outs = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    out_ok, col_ok = outs < N, cols < K
    zero = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    accs = (zero, zero, zero, zero)  # one per center of the span (_SPAN == 4)
    for m0 in range(0, M, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        dy_tile = dy_ptr + rows.to(tl.int64)[None, :] * stride_dym + outs[:, None] * stride_dyn
        dy_t = tl.load(dy_tile, mask=out_ok[:, None] & row_ok[None, :], other=0.0)
        x_tile = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :] * stride_xk
        x = tl.load(x_tile, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        _, psi, step = _span_start(x.to(tl.float32) * scale + shift, a)
        for j in tl.static_range(_SPAN):
            if j > 0:
                psi = psi * step
            phi = (psi * _decay(j)).to(dy_t.dtype)
            accs = accs[1:] + (_mma(dy_t, phi, accs[0], DOT),)
    for j in tl.static_range(_SPAN):
        dw_tile = dw_ptr + outs[:, None] * stride_dwn + (cols[None, :] * G + a + j) * stride_dwk
        mask = (out_ok[:, None] & col_ok[None, :]) & (a + j < G)
        tl.store(dw_tile, accs[j].to(dw_ptr.dtype.element_ty), mask=mask)


def _configs(tiles: tuple[tuple[int, int, int, int, int], ...]) -> list[triton.Config]:
    """Autotune candidates from (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)."""
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": _GROUP_M}, num_warps=w, num_stages=s)
        for m, n, k, w, s in tiles
    ]


# H100 candidates per kernel (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages), sized so that the accumulators and the
# basis temporaries of a tile stay in registers; the autotuner skips a config that does not fit in shared
# memory (the last of each list fits with fp32 operands). The backward kernels reduce over BLOCK_N (dx) or
# BLOCK_M (dW).
_TILES = {
    "kan_fwd": ((128, 128, 64, 8, 3), (128, 256, 32, 8, 3), (64, 128, 32, 4, 4)),
    "kan_dx": ((128, 64, 64, 8, 3), (64, 64, 128, 8, 3), (64, 64, 64, 4, 4)),
    "kan_dw": ((64, 128, 128, 8, 3), (32, 128, 64, 4, 4), (32, 64, 64, 4, 4)),
    "edge_fwd": ((128, 128, 32, 8, 3), (128, 256, 32, 8, 2), (64, 64, 32, 4, 2)),
    "edge_dx": ((64, 64, 64, 4, 3), (128, 64, 64, 8, 3), (64, 64, 128, 8, 3)),
    "edge_dw": ((64, 64, 64, 8, 3), (64, 128, 64, 8, 3), (32, 64, 64, 4, 3)),
}
_KERNELS = {
    "kan_fwd": _kan_fwd_kernel,
    "kan_dx": _kan_bwd_dx_kernel,
    "kan_dw": _kan_bwd_dw_kernel,
    "edge_fwd": _edge_fwd_kernel,
    "edge_dx": _edge_bwd_dx_kernel,
    "edge_dw": _edge_bwd_dw_kernel,
}


@functools.cache
def _kernel(name: str) -> triton.runtime.KernelInterface:
    """The kernel as launched: fixed tiles under the interpreter, autotuned on CUDA (keyed on N, K, G)."""
    if INTERPRET:
        return _KERNELS[name]
    reset = ["part_ptr"] if name == "kan_dx" else None  # row blocks a discarded config wrote must read 0
    return triton.autotune(configs=_configs(_TILES[name]), key=["N", "K", "G"], reset_to_zero=reset)(_KERNELS[name])


def _launch(name: str, grid, *args, **kwargs) -> None:
    """Launch a kernel with the interpreter's tiles or the autotuned ones."""
    meta = _INTERP_META if INTERPRET else {}
    _kernel(name)[grid](*args, **kwargs, **meta)


def _dot_precision(dtype: torch.dtype) -> str:
    """tl.dot precision: fp32 operands follow torch's matmul TF32 switch (exact fp32 by default)."""
    if INTERPRET:
        return "emulate"
    return "tf32" if dtype != torch.float32 or torch.backends.cuda.matmul.allow_tf32 else "ieee"


def _grid_constants(grid_min: float, grid_max: float, num_grids: int) -> tuple[float, float, float]:
    """(1/h, -grid_min/h, -2/h): u = x/h - grid_min/h and dphi/dx = -2/h (u - g) phi."""
    check_grid(grid_min, grid_max, num_grids)
    h = (grid_max - grid_min) / (num_grids - 1)
    return 1.0 / h, -grid_min / h, -2.0 / h


def _check(x2d: torch.Tensor, weight: torch.Tensor, k_weight: int) -> None:
    """Operands are [M, K] and [N, k_weight] on a CUDA device (or under the interpreter)."""
    if not (x2d.is_cuda or INTERPRET):
        raise RuntimeError("the fused KAN kernels need CUDA tensors (or TRITON_INTERPRET=1 before importing triton)")
    if x2d.dim() != 2 or weight.dim() != 2 or weight.shape[1] != k_weight:
        raise ValueError(f"expected x [M, K] and weight [N, {k_weight}], got {tuple(x2d.shape)}, {tuple(weight.shape)}")


def _grid_weight_rows(gw: torch.Tensor, K: int) -> tuple[torch.Tensor, int]:
    """Grid weights as fp32 [rows, G] and the row stride per channel (0 for one shared row)."""
    gw32 = gw.detach().to(torch.float32).reshape(-1, gw.shape[-1]).contiguous()
    if gw32.shape[0] not in (1, K):
        raise ValueError(f"grid weight must be [1, G] or [{K}, G], got {tuple(gw.shape)}")
    return gw32, (0 if gw32.shape[0] == 1 else gw32.shape[1])


def kan_fwd(
    x2d: torch.Tensor, gw: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float
) -> torch.Tensor:
    """y = psi(x) W^T for x [M, K], grid weights [1 or K, G], W [N, K]; y in W's dtype."""
    (M, K), N = x2d.shape, weight.shape[0]
    _check(x2d, weight, K)
    gw32, stride_gw = _grid_weight_rows(gw, K)
    G = gw32.shape[1]
    scale, shift, _ = _grid_constants(grid_min, grid_max, G)
    y = torch.empty(M, N, device=x2d.device, dtype=weight.dtype)
    if M == 0:
        return y
    grid = lambda m: (triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(N, m["BLOCK_N"]),)  # noqa: E731
    _launch(
        "kan_fwd", grid, x2d, gw32, weight, y, M, N, K,
        *x2d.stride(), stride_gw, *weight.stride(), *y.stride(),
        scale, shift, G=G, DOT=_dot_precision(weight.dtype),
    )  # fmt: skip
    return y


def kan_bwd(
    x2d: torch.Tensor,
    gw: torch.Tensor,
    weight: torch.Tensor,
    dy: torch.Tensor,
    grid_min: float,
    grid_max: float,
    need_dx: bool = True,
    need_dw: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(dx in x's dtype, grid-weight grad fp32 [1 or K, G], dW in W's dtype); the first two come together."""
    (M, K), N = x2d.shape, weight.shape[0]
    _check(x2d, weight, K)
    gw32, stride_gw = _grid_weight_rows(gw, K)
    G = gw32.shape[1]
    scale, shift, dx_scale = _grid_constants(grid_min, grid_max, G)
    dy = dy.to(weight.dtype)
    dot = _dot_precision(weight.dtype)
    dx = dgw = dw = None
    if need_dx:
        dx = torch.empty(M, K, device=x2d.device, dtype=x2d.dtype)
        min_block_m = _INTERP_META["BLOCK_M"] if INTERPRET else min(t[0] for t in _TILES["kan_dx"])
        part = torch.zeros(triton.cdiv(M, min_block_m), K, G, device=x2d.device, dtype=torch.float32)
        if M > 0:
            grid = lambda m: (triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(K, m["BLOCK_K"]),)  # noqa: E731
            _launch(
                "kan_dx", grid, x2d, gw32, weight, dy, dx, part, M, N, K,
                *x2d.stride(), stride_gw, *weight.stride(), *dy.stride(), *dx.stride(),
                scale, shift, dx_scale, G=G, DOT=dot,
            )  # fmt: skip
        dgw = part.sum(0) if stride_gw else part.sum((0, 1)).unsqueeze(0)
    if need_dw:
        dw = torch.empty(weight.shape, device=weight.device, dtype=weight.dtype)
        if M == 0:
            dw.zero_()
        else:
            grid = lambda m: (triton.cdiv(N, m["BLOCK_N"]) * triton.cdiv(K, m["BLOCK_K"]),)  # noqa: E731
            _launch(
                "kan_dw", grid, x2d, gw32, dy, dw, M, N, K,
                *x2d.stride(), stride_gw, *dy.stride(), *dw.stride(),
                scale, shift, G=G, DOT=dot,
            )  # fmt: skip
    return dx, dgw, dw


def _by_center(weight: torch.Tensor, K: int, G: int) -> torch.Tensor:
    """W [N, K*G] (column p*G + g) as a contiguous [N, G, K]: each center's channel block is contiguous."""
    return weight.view(weight.shape[0], K, G).transpose(1, 2).contiguous()


def edge_fwd(x2d: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float, G: int) -> torch.Tensor:
    """y = Phi(x) W^T for x [M, K], W [N, K*G]; y in W's dtype."""
    (M, K), N = x2d.shape, weight.shape[0]
    _check(x2d, weight, K * G)
    scale, shift, _ = _grid_constants(grid_min, grid_max, G)
    y = torch.empty(M, N, device=x2d.device, dtype=weight.dtype)
    if M == 0:
        return y
    w3 = _by_center(weight, K, G)
    grid = lambda m: (triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(N, m["BLOCK_N"]),)  # noqa: E731
    _launch(
        "edge_fwd", grid, x2d, w3, y, M, N, K, *x2d.stride(), *w3.stride(), *y.stride(),
        scale, shift, G=G, DOT=_dot_precision(weight.dtype),
    )  # fmt: skip
    return y


def edge_bwd(
    x2d: torch.Tensor,
    weight: torch.Tensor,
    dy: torch.Tensor,
    grid_min: float,
    grid_max: float,
    G: int,
    need_dx: bool = True,
    need_dw: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(dx in x's dtype, dW in W's dtype [N, K*G]) of y = Phi(x) W^T."""
    (M, K), N = x2d.shape, weight.shape[0]
    _check(x2d, weight, K * G)
    scale, shift, dx_scale = _grid_constants(grid_min, grid_max, G)
    dy = dy.to(weight.dtype)
    dot = _dot_precision(weight.dtype)
    dx = dw = None
    if need_dx:
        dx = torch.empty(M, K, device=x2d.device, dtype=x2d.dtype)
        if M > 0:
            w3 = _by_center(weight, K, G)
            grid = lambda m: (triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(K, m["BLOCK_K"]),)  # noqa: E731
            _launch(
                "edge_dx", grid, x2d, w3, dy, dx, M, N, K,
                *x2d.stride(), *w3.stride(), *dy.stride(), *dx.stride(),
                scale, shift, dx_scale, G=G, DOT=dot,
            )  # fmt: skip
    if need_dw:
        dw = torch.empty(weight.shape, device=weight.device, dtype=weight.dtype)
        if M == 0:
            dw.zero_()
        else:
            grid = lambda m: (triton.cdiv(N, m["BLOCK_N"]) * triton.cdiv(K, m["BLOCK_K"]), triton.cdiv(G, 4))  # noqa: E731
            _launch(
                "edge_dw", grid, x2d, dy, dw, M, N, K, *x2d.stride(), *dy.stride(), *dw.stride(),
                scale, shift, G=G, DOT=dot,
            )  # fmt: skip
    return dx, dw
