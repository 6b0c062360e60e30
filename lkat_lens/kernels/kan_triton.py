"""Triton kernels of the whole RBF-KAN layer fused into its matmuls, forward and backward.

Shared / channel basis, x [M, K], grid weights w [K, G] (the shared form passes one row with stride 0),
W [N, K]: y = psi(x) W^T with psi(x)[r, k] = sum_g w[k, g] phi_g(x[r, k]). psi is evaluated on the A tile
as it is loaded (prologue), so it never reaches HBM. The backward computes dpsi = dy W with
dx = dpsi * psi'(x) and this tile's share of dw[k, g] = sum_r dpsi[r, k] phi_g(x[r, k]) in the epilogue
(a [row blocks, K, G] partial the host sums in a fixed order), and dW = dy^T psi(x) with psi again
recomputed on the operand load, its reduction over rows split across programs (fp32 partials the host sums in a
fixed order), since dW's [N, K] has too few tiles to fill the GPU.

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

from .host_math import cdiv
from .rbf import check_grid
from .rbf_triton import INTERPRET, num_sms
from .tuned import TunedKernel, programs_key

_SPAN: tl.constexpr = tl.constexpr(4)
# v is clamped to [-10, 13]: there every phi of the span is below e^-100 and exp(2v) stays finite.
_CLAMP: tl.constexpr = tl.constexpr(10.0)
# |u - g| beyond this gives phi_g == 0 exactly; clamping keeps t * phi_g finite for huge x.
_T_MAX: tl.constexpr = tl.constexpr(40.0)
_GROUP_M = 8
# Under the interpreter: one small tile shape, so that masking and every loop run on tiny inputs.
_INTERP_META = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}
_MIN_SPLIT_ROWS = 1024  # a dW row split below this costs more in its partial's write than it gains


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
def _block(start, BLOCK: tl.constexpr, total):
    """Indices start .. start + BLOCK - 1 and whether each is below total."""
    idx = start + tl.arange(0, BLOCK)
    return idx, idx < total


@triton.jit
def _program_tile(R, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's tile of an [R, C] grid: (row block, rows, row mask, columns, column mask). Row blocks are
    grouped GROUP_M at a time for L2 reuse."""
    num_r = tl.cdiv(R, BLOCK_R)
    width = GROUP_M * tl.cdiv(C, BLOCK_C)
    pid = tl.program_id(0)
    first = (pid // width) * GROUP_M
    size = tl.minimum(num_r - first, GROUP_M)
    pid_r, pid_c = first + (pid % width) % size, (pid % width) // size
    rows, row_ok = _block(pid_r * BLOCK_R, BLOCK_R, R)
    cols, col_ok = _block(pid_c * BLOCK_C, BLOCK_C, C)
    return pid_r, rows, row_ok, cols, col_ok


@triton.jit
def _load(ptr, r, c, stride_r, stride_c, r_ok, c_ok):
    """The tile ptr[r, c] of a strided matrix, 0 where a row or a column is masked off."""
    return tl.load(ptr + r[:, None] * stride_r + c[None, :] * stride_c, mask=r_ok[:, None] & c_ok[None, :], other=0.0)


@triton.jit
def _store(ptr, value, r, c, stride_r, stride_c, r_ok, c_ok):
    """Write value (in the matrix's dtype) to the tile ptr[r, c] of a strided matrix, where both masks hold."""
    tl.store(
        ptr + r[:, None] * stride_r + c[None, :] * stride_c,
        value.to(ptr.dtype.element_ty),
        mask=r_ok[:, None] & c_ok[None, :],
    )


@triton.jit
def _load_u(x_ptr, rows, cols, stride_xm, stride_xk, row_ok, col_ok, scale, shift):
    """u = (x - grid_min) / h on the x tile [rows, cols], in fp32."""
    x = _load(x_ptr, rows.to(tl.int64), cols, stride_xm, stride_xk, row_ok, col_ok)
    return x.to(tl.float32) * scale + shift


@triton.jit
def _dy_w(
    dy_ptr, w_ptr, w_offset, rows, row_ok, cols, col_ok, N,
    stride_dym, stride_dyn, stride_wn, stride_wk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """(dy W)[rows, cols] in fp32 for dy [M, N] and W [N, K] at w_ptr + w_offset (the edge form passes one
    center's block of its [N, G, K] W), the loop running over N."""
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        outs, out_ok = _block(n0, BLOCK_N, N)
        dy = _load(dy_ptr, rows.to(tl.int64), outs, stride_dym, stride_dyn, row_ok, out_ok)
        w_tile = w_ptr + outs[:, None] * stride_wn + w_offset + cols[None, :] * stride_wk
        w = tl.load(w_tile, mask=out_ok[:, None] & col_ok[None, :], other=0.0)
        acc = _mma(dy, w, acc, DOT)
    return acc


@triton.jit
def _grid_sum(u, gw_ptr, cols, col_ok, stride_gw, G: tl.constexpr, dpsi, part_row):
    """On a [rows, cols] tile of u, in fp32 (0 on masked columns): psi = sum_g w[col, g] phi_g(u); or, given
    dpsi, sum_g w[col, g] phi_g(u) (u - g) (psi' but for the factor -2/h), storing the tile's share of the
    grid-weight gradient, sum_rows dpsi phi_g(u), at part_row + g."""
    out = tl.zeros_like(u)
    for a in tl.static_range(0, G, _SPAN):
        v, psi, step = _span_start(u, a)
        for j in tl.static_range(_SPAN):
            if a + j < G:
                if j > 0:
                    psi = psi * step
                w = tl.load(gw_ptr + cols * stride_gw + (a + j), mask=col_ok, other=0.0) * _decay(j)
                if dpsi is None:
                    out += w[None, :] * psi
                else:
                    out += w[None, :] * psi * (v - j)
                    tl.store(part_row + (a + j), tl.sum(dpsi * psi, axis=0) * _decay(j), mask=col_ok)
    return out


@triton.jit
def _kan_fwd_kernel(
    x_ptr, gw_ptr, w_ptr, y_ptr, M, N, K, programs,
    stride_xm, stride_xk, stride_gw, stride_wn, stride_wk, stride_ym, stride_yn,
    scale, shift,
    G: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """y = psi(x) W^T with psi computed on the A tile."""
    pid_m, rows, row_ok, outs, out_ok = _program_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols, col_ok = _block(k0, BLOCK_K, K)
        u = _load_u(x_ptr, rows, cols, stride_xm, stride_xk, row_ok, col_ok, scale, shift)
        psi = _grid_sum(u, gw_ptr, cols, col_ok, stride_gw, G, None, None)
        b = _load(w_ptr, cols, outs, stride_wk, stride_wn, col_ok, out_ok)
        acc = _mma(psi.to(b.dtype), b, acc, DOT)
    _store(y_ptr, acc, rows.to(tl.int64), outs, stride_ym, stride_yn, row_ok, out_ok)


@triton.jit
def _kan_bwd_dx_kernel(
    x_ptr, gw_ptr, w_ptr, dy_ptr, dx_ptr, part_ptr, M, N, K, programs,
    stride_xm, stride_xk, stride_gw, stride_wn, stride_wk, stride_dym, stride_dyn, stride_dxm, stride_dxk,
    scale, shift, dx_scale,
    G: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """dpsi = dy W on a [BLOCK_M, BLOCK_K] tile; epilogue: dx = dpsi psi'(x), part[row block] = dw share."""
    pid_m, rows, row_ok, cols, col_ok = _program_tile(M, K, BLOCK_M, BLOCK_K, GROUP_M)
    dpsi = _dy_w(
        dy_ptr, w_ptr, 0, rows, row_ok, cols, col_ok, N, stride_dym, stride_dyn, stride_wn, stride_wk,
        BLOCK_M, BLOCK_N, BLOCK_K, DOT,
    )  # fmt: skip
    u = _load_u(x_ptr, rows, cols, stride_xm, stride_xk, row_ok, col_ok, scale, shift)
    part_row = part_ptr + pid_m.to(tl.int64) * K * G + cols * G
    deriv = _grid_sum(u, gw_ptr, cols, col_ok, stride_gw, G, dpsi, part_row)
    _store(dx_ptr, dpsi * deriv * dx_scale, rows.to(tl.int64), cols, stride_dxm, stride_dxk, row_ok, col_ok)


@triton.jit
def _kan_bwd_dw_kernel(
    x_ptr, gw_ptr, dy_ptr, dw_ptr, M, N, K, programs,
    stride_xm, stride_xk, stride_gw, stride_dym, stride_dyn, stride_dwn, stride_dwk,
    scale, shift,
    G: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """dW = dy^T psi(x) with psi computed on the B tile, split over rows: program (tile, s) sums the rows of
    split s (num_programs(1) splits of whole BLOCK_M blocks) into the fp32 partial dw[s]."""
    pid_n, outs, out_ok, cols, col_ok = _program_tile(N, K, BLOCK_N, BLOCK_K, GROUP_M)
    split, splits = tl.program_id(1), tl.num_programs(1)
    rows_per_split = tl.cdiv(tl.cdiv(M, splits), BLOCK_M) * BLOCK_M
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for m0 in range(split * rows_per_split, tl.minimum((split + 1) * rows_per_split, M), BLOCK_M):
        rows, row_ok = _block(m0, BLOCK_M, M)
        dy_t = _load(dy_ptr, outs, rows.to(tl.int64), stride_dyn, stride_dym, out_ok, row_ok)
        u = _load_u(x_ptr, rows, cols, stride_xm, stride_xk, row_ok, col_ok, scale, shift)
        psi = _grid_sum(u, gw_ptr, cols, col_ok, stride_gw, G, None, None)
        acc = _mma(dy_t, psi.to(dy_t.dtype), acc, DOT)
    _store(dw_ptr + split.to(tl.int64) * N * K, acc, outs, cols, stride_dwn, stride_dwk, out_ok, col_ok)


@triton.jit
def _edge_fwd_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K, programs,
    stride_xm, stride_xk, stride_wn, stride_wg, stride_wk, stride_ym, stride_yn,
    scale, shift,
    G: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """y = Phi(x) W^T; each step turns one x tile into the basis tiles of four centers (W as [N, G, K])."""
    pid_m, rows, row_ok, outs, out_ok = _program_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    spans = (G + _SPAN - 1) // _SPAN
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step_id in range(0, tl.cdiv(K, BLOCK_K) * spans):
        a = (step_id % spans) * _SPAN
        cols, col_ok = _block((step_id // spans) * BLOCK_K, BLOCK_K, K)
        u = _load_u(x_ptr, rows, cols, stride_xm, stride_xk, row_ok, col_ok, scale, shift)
        _, psi, step = _span_start(u, a)
        for j in tl.static_range(_SPAN):
            if j > 0:
                psi = psi * step
            w_tile = w_ptr + outs[None, :] * stride_wn + (a + j) * stride_wg + cols[:, None] * stride_wk
            b = tl.load(w_tile, mask=(col_ok[:, None] & out_ok[None, :]) & (a + j < G), other=0.0)
            acc = _mma((psi * _decay(j)).to(b.dtype), b, acc, DOT)
    _store(y_ptr, acc, rows.to(tl.int64), outs, stride_ym, stride_yn, row_ok, out_ok)


@triton.jit
def _edge_bwd_dx_kernel(
    x_ptr, w_ptr, dy_ptr, dx_ptr, M, N, K, programs,
    stride_xm, stride_xk, stride_wn, stride_wg, stride_wk, stride_dym, stride_dyn, stride_dxm, stride_dxk,
    scale, shift, dx_scale,
    G: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """dx[:, p] = sum_g (dy W)[:, p, g] phi_g'(x[:, p]): one dy W tile per center, contracted in registers."""
    pid_m, rows, row_ok, cols, col_ok = _program_tile(M, K, BLOCK_M, BLOCK_K, GROUP_M)
    u = _load_u(x_ptr, rows, cols, stride_xm, stride_xk, row_ok, col_ok, scale, shift)
    dx = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for g in range(G):
        dphi = _dy_w(
            dy_ptr, w_ptr, g * stride_wg, rows, row_ok, cols, col_ok, N, stride_dym, stride_dyn, stride_wn, stride_wk,
            BLOCK_M, BLOCK_N, BLOCK_K, DOT,
        )  # fmt: skip
        t = tl.minimum(tl.maximum(u - g, -_T_MAX), _T_MAX)
        dx += dphi * t * tl.exp(-t * t)
    _store(dx_ptr, dx * dx_scale, rows.to(tl.int64), cols, stride_dxm, stride_dxk, row_ok, col_ok)


@triton.jit
def _edge_bwd_dw_kernel(
    x_ptr, dy_ptr, dw_ptr, M, N, K, programs,
    stride_xm, stride_xk, stride_dym, stride_dyn, stride_dwn, stride_dwk,
    scale, shift,
    G: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """dW[:, p*G + g] = dy^T phi_g(x[:, p]) for the four centers of span program_id(1), stored in W's layout."""
    pid_n, outs, out_ok, cols, col_ok = _program_tile(N, K, BLOCK_N, BLOCK_K, GROUP_M)
    a = tl.program_id(1) * _SPAN
    zero = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    accs = (zero, zero, zero, zero)  # one per center of the span (_SPAN == 4)
    for m0 in range(0, M, BLOCK_M):
        rows, row_ok = _block(m0, BLOCK_M, M)
        dy_t = _load(dy_ptr, outs, rows.to(tl.int64), stride_dyn, stride_dym, out_ok, row_ok)
        u = _load_u(x_ptr, rows, cols, stride_xm, stride_xk, row_ok, col_ok, scale, shift)
        _, psi, step = _span_start(u, a)
        for j in tl.static_range(_SPAN):
            if j > 0:
                psi = psi * step
            phi = (psi * _decay(j)).to(dy_t.dtype)
            accs = accs[1:] + (_mma(dy_t, phi, accs[0], DOT),)
    for j in tl.static_range(_SPAN):
        dw_tile = dw_ptr + outs[:, None] * stride_dwn + (cols[None, :] * G + a + j) * stride_dwk
        tl.store(dw_tile, accs[j].to(dw_ptr.dtype.element_ty), mask=(out_ok[:, None] & col_ok[None, :]) & (a + j < G))


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
def _autotuned(name: str) -> TunedKernel:
    """The CUDA kernel autotuned over its tiles, keyed on N, K, G and the rows (`programs` = tuned.programs_key(M),
    which only the key reads)."""
    reset = ["part_ptr"] if name == "kan_dx" else None  # row blocks a discarded config wrote must read 0
    tune = triton.autotune(configs=_configs(_TILES[name]), key=["N", "K", "G", "programs"], reset_to_zero=reset)
    return TunedKernel(tune(_KERNELS[name]))


def _kernel(name: str) -> triton.runtime.KernelInterface | TunedKernel:
    """The kernel as launched: fixed tiles under the interpreter, autotuned on CUDA."""
    return _KERNELS[name] if INTERPRET else _autotuned(name)


def _launch(name: str, tiles: tuple[int, int], blocks: str, *args, spans: int = 1, **kwargs) -> None:
    """Launch a kernel with one program per tile of a tiles[0] x tiles[1] grid, the tile BLOCK_<blocks[0]> x
    BLOCK_<blocks[1]> (the interpreter's or the autotuned one), times `spans` along the grid's second axis."""
    meta = _INTERP_META if INTERPRET else {}
    rows, cols = tiles
    block_r, block_c = (f"BLOCK_{b}" for b in blocks)
    grid = lambda m: (cdiv(rows, m[block_r]) * cdiv(cols, m[block_c]), spans)  # noqa: E731
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


def _shapes(x2d: torch.Tensor, weight: torch.Tensor, per_channel: int) -> tuple[int, int, int]:
    """(M, K, N) of x [M, K] and W [N, K * per_channel] on a CUDA device (or under the interpreter)."""
    if not (x2d.is_cuda or INTERPRET):
        raise RuntimeError("the fused KAN kernels need CUDA tensors (or TRITON_INTERPRET=1 before importing triton)")
    if x2d.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x2d.shape[1] * per_channel:
        got = f"{tuple(x2d.shape)}, {tuple(weight.shape)}"
        raise ValueError(f"expected x [M, K] and weight [N, K * {per_channel}], got {got}")
    return (*x2d.shape, weight.shape[0])


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
    M, K, N = _shapes(x2d, weight, 1)
    gw32, stride_gw = _grid_weight_rows(gw, K)
    G = gw32.shape[1]
    scale, shift, _ = _grid_constants(grid_min, grid_max, G)
    y = torch.empty(M, N, device=x2d.device, dtype=weight.dtype)
    if M:
        _launch(
            "kan_fwd", (M, N), "MN", x2d, gw32, weight, y, M, N, K, programs_key(M), *x2d.stride(), stride_gw,
            *weight.stride(), *y.stride(), scale, shift, G=G, DOT=_dot_precision(weight.dtype),
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
    M, K, N = _shapes(x2d, weight, 1)
    gw32, stride_gw = _grid_weight_rows(gw, K)
    G = gw32.shape[1]
    scale, shift, dx_scale = _grid_constants(grid_min, grid_max, G)
    dy = dy.to(weight.dtype)
    dot = _dot_precision(weight.dtype)
    dx = dgw = dw = None
    if need_dx:
        dx = torch.empty(M, K, device=x2d.device, dtype=x2d.dtype)
        min_block_m = _INTERP_META["BLOCK_M"] if INTERPRET else min(t[0] for t in _TILES["kan_dx"])
        part = torch.zeros(cdiv(M, min_block_m), K, G, device=x2d.device, dtype=torch.float32)
        if M:
            _launch(
                "kan_dx", (M, K), "MK", x2d, gw32, weight, dy, dx, part, M, N, K, programs_key(M),
                *x2d.stride(), stride_gw, *weight.stride(), *dy.stride(), *dx.stride(),
                scale, shift, dx_scale, G=G, DOT=dot,
            )  # fmt: skip
        dgw = part.sum(0) if stride_gw else part.sum((0, 1)).unsqueeze(0)
    if need_dw:
        dw = _empty_weight_grad(weight, M)
        if M:
            splits = _row_splits(x2d.device, M, N, K)
            part = torch.empty(splits, N, K, device=x2d.device, dtype=torch.float32)
            _launch(
                "kan_dw", (N, K), "NK", x2d, gw32, dy, part, M, N, K, programs_key(M),
                *x2d.stride(), stride_gw, *dy.stride(), *part.stride()[1:], scale, shift, G=G, DOT=dot,
                spans=splits,
            )  # fmt: skip
            dw.copy_(part.sum(0))
    return dx, dgw, dw


def _row_splits(device: torch.device, M: int, N: int, K: int) -> int:
    """How many row splits dW's reduction over M gets: its [N, K] output has few tiles (12 for a 768 x 192 layer
    at 128 x 128), so without splits a handful of programs loop over every row while most SMs idle. Enough splits
    for about two waves of the smallest dW tile, each split at least _MIN_SPLIT_ROWS rows; summed in a fixed
    order (deterministic)."""
    if INTERPRET:
        return max(1, min(4, M // _INTERP_META["BLOCK_M"]))
    tiles = cdiv(N, 64) * cdiv(K, 64)
    waves = 2 * num_sms(device)
    return max(1, min(waves // tiles, M // _MIN_SPLIT_ROWS))


def _empty_weight_grad(weight: torch.Tensor, M: int) -> torch.Tensor:
    """A contiguous tensor for dW in W's shape and dtype, zero when there are no rows (no kernel then writes it)."""
    alloc = torch.zeros if M == 0 else torch.empty
    return alloc(weight.shape, device=weight.device, dtype=weight.dtype)


def _by_center(weight: torch.Tensor, K: int, G: int) -> torch.Tensor:
    """W [N, K*G] (column p*G + g) as a contiguous [N, G, K]: each center's channel block is contiguous."""
    return weight.view(weight.shape[0], K, G).transpose(1, 2).contiguous()


def edge_fwd(x2d: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float, G: int) -> torch.Tensor:
    """y = Phi(x) W^T for x [M, K], W [N, K*G]; y in W's dtype."""
    M, K, N = _shapes(x2d, weight, G)
    scale, shift, _ = _grid_constants(grid_min, grid_max, G)
    y = torch.empty(M, N, device=x2d.device, dtype=weight.dtype)
    if M:
        w3 = _by_center(weight, K, G)
        _launch(
            "edge_fwd", (M, N), "MN", x2d, w3, y, M, N, K, programs_key(M), *x2d.stride(), *w3.stride(), *y.stride(),
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
    M, K, N = _shapes(x2d, weight, G)
    scale, shift, dx_scale = _grid_constants(grid_min, grid_max, G)
    dy = dy.to(weight.dtype)
    dot = _dot_precision(weight.dtype)
    dx = dw = None
    if need_dx:
        dx = torch.empty(M, K, device=x2d.device, dtype=x2d.dtype)
        if M:
            w3 = _by_center(weight, K, G)
            _launch(
                "edge_dx", (M, K), "MK", x2d, w3, dy, dx, M, N, K, programs_key(M),
                *x2d.stride(), *w3.stride(), *dy.stride(), *dx.stride(), scale, shift, dx_scale, G=G, DOT=dot,
            )  # fmt: skip
    if need_dw:
        dw = _empty_weight_grad(weight, M)
        if M:
            _launch(
                "edge_dw", (N, K), "NK", x2d, dy, dw, M, N, K, programs_key(M), *x2d.stride(), *dy.stride(),
                *dw.stride(), scale, shift, G=G, DOT=dot, spans=cdiv(G, _SPAN),
            )  # fmt: skip
    return dx, dw
