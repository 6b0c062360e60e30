"""Triton kernels of the whole RBF-KAN layer fused into its matmuls, forward and backward.

Shared / channel basis, x [M, K], grid weights w [K, G] (the shared form passes one row, read as G scalars),
W [N, K]: y = psi(x) W^T with psi(x)[r, k] = sum_g w[k, g] phi_g(x[r, k]). psi is evaluated on the A tile
as it is loaded (prologue), so it never reaches HBM in the forward. The backward kernel computes dpsi = dy W with,
in its epilogue, dx = dpsi * psi'(x), the tile's share of dw[k, g] = sum_r dpsi[r, k] phi_g(x[r, k]) (per column,
or for a shared row one sum per tile; the host sums the shares in a fixed order) and psi(x) itself, written in W's
dtype for dW = dy^T psi, which cuBLAS computes (psi is not saved: it lives only for that GEMM).

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

import torch
import triton
import triton.language as tl

from . import rbf_triton
from .host_math import cdiv
from .rbf import check_grid
from .rbf_triton import INTERPRET
from .tuned import TunedKernel, kernel_table, programs_key

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
def _weight(gw_ptr, cols, col_ok, stride_gw, a: tl.constexpr, j: tl.constexpr, SHARED: tl.constexpr):
    """w[col, a + j] e^{-j^2} for center j of the span starting at a: a scalar for a SHARED row, else [1, cols]."""
    if SHARED:
        w = tl.load(gw_ptr + (a + j)) * _decay(j)
    else:
        w = (tl.load(gw_ptr + cols * stride_gw + (a + j), mask=col_ok, other=0.0) * _decay(j))[None, :]
    return w


@triton.jit
def _grid_sum(u, gw_ptr, cols, col_ok, stride_gw, G: tl.constexpr, SHARED: tl.constexpr, dpsi, part_ptr, stride_pg):
    """(psi, slope) on a [rows, cols] tile of u, in fp32: psi = sum_g w[col, g] phi_g(u) and, given dpsi (else None,
    and slope stays 0), slope = sum_g w[col, g] phi_g(u) (u - g) (psi' but for the factor -2/h), storing the tile's
    share of the grid-weight gradient, sum dpsi phi_g(u), at part_ptr + g stride_pg: per column (at part_ptr + cols G
    + g), or SHARED (one row of grid weights for every column) over the whole tile."""
    psi, slope = tl.zeros_like(u), tl.zeros_like(u)
    for a in tl.static_range(0, G, _SPAN):
        v, phi, step = _span_start(u, a)
        for j in tl.static_range(_SPAN):
            if a + j < G:
                if j > 0:
                    phi = phi * step
                w = _weight(gw_ptr, cols, col_ok, stride_gw, a, j, SHARED)
                psi += w * phi
                if dpsi is not None:
                    slope += w * phi * (v - j)
                    share = dpsi * phi
                    if SHARED:
                        one = tl.arange(0, 1)
                        total = tl.sum(tl.sum(share, axis=1), axis=0)
                        tl.store(part_ptr + (a + j) * stride_pg + one, total * _decay(j))
                    else:
                        tl.store(part_ptr + cols * G + (a + j), tl.sum(share, axis=0) * _decay(j), mask=col_ok)
    return psi, slope


@triton.jit
def _kan_fwd_kernel(
    x_ptr, gw_ptr, w_ptr, y_ptr, M, N, K, programs,
    stride_xm, stride_xk, stride_gw, stride_wn, stride_wk, stride_ym, stride_yn,
    scale, shift,
    G: tl.constexpr, SHARED: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """y = psi(x) W^T with psi computed on the A tile."""
    pid_m, rows, row_ok, outs, out_ok = _program_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols, col_ok = _block(k0, BLOCK_K, K)
        u = _load_u(x_ptr, rows, cols, stride_xm, stride_xk, row_ok, col_ok, scale, shift)
        psi = _grid_sum(u, gw_ptr, cols, col_ok, stride_gw, G, SHARED, None, None, 0)[0]
        b = _load(w_ptr, cols, outs, stride_wk, stride_wn, col_ok, out_ok)
        acc = _mma(psi.to(b.dtype), b, acc, DOT)
    _store(y_ptr, acc, rows.to(tl.int64), outs, stride_ym, stride_yn, row_ok, out_ok)


@triton.jit
def _kan_bwd_dx_kernel(
    x_ptr, gw_ptr, w_ptr, dy_ptr, dx_ptr, part_ptr, psi_ptr, M, N, K, programs,
    stride_xm, stride_xk, stride_gw, stride_wn, stride_wk, stride_dym, stride_dyn, stride_dxm, stride_dxk,
    stride_pg, stride_pm, stride_pk, scale, shift, dx_scale,
    G: tl.constexpr, SHARED: tl.constexpr, DX: tl.constexpr, PSI: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """dpsi = dy W on a [BLOCK_M, BLOCK_K] tile; epilogue: DX, dx = dpsi psi'(x) and the tile's share of the
    grid-weight gradient in part ([row block, K, G], or SHARED [G, program]); PSI, psi(x) in psi's dtype (W's: dW =
    dy^T psi is then a cuBLAS GEMM)."""
    pid_m, rows, row_ok, cols, col_ok = _program_tile(M, K, BLOCK_M, BLOCK_K, GROUP_M)
    u = _load_u(x_ptr, rows, cols, stride_xm, stride_xk, row_ok, col_ok, scale, shift)
    if DX:
        dpsi = _dy_w(
            dy_ptr, w_ptr, 0, rows, row_ok, cols, col_ok, N, stride_dym, stride_dyn, stride_wn, stride_wk,
            BLOCK_M, BLOCK_N, BLOCK_K, DOT,
        )  # fmt: skip
        if SHARED:
            part_tile = part_ptr + tl.program_id(0)
        else:
            part_tile = part_ptr + pid_m.to(tl.int64) * K * G
        psi, slope = _grid_sum(u, gw_ptr, cols, col_ok, stride_gw, G, SHARED, dpsi, part_tile, stride_pg)
        _store(dx_ptr, dpsi * slope * dx_scale, rows.to(tl.int64), cols, stride_dxm, stride_dxk, row_ok, col_ok)
    else:
        psi = _grid_sum(u, gw_ptr, cols, col_ok, stride_gw, G, SHARED, None, None, 0)[0]
    if PSI:
        _store(psi_ptr, psi, rows.to(tl.int64), cols, stride_pm, stride_pk, row_ok, col_ok)


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


# Candidates per kernel (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages), sized so that the accumulators and the
# basis temporaries of a tile stay in registers; the autotuner skips a config that does not fit in shared
# memory. The dx kernels reduce over BLOCK_N, edge's dW over BLOCK_M. The shared/channel kernels' are the fastest of
# benchmarks/sweep_kan_tiles.py's 21 and 34 candidates at LKAT-T's fc1 and fc2 (H200, bf16).
TILES = {
    "kan_fwd": ((64, 256, 32, 8, 3), (64, 128, 32, 4, 3), (128, 128, 32, 8, 3)),
    "kan_dx": ((64, 64, 64, 4, 4), (64, 128, 64, 4, 3), (128, 128, 64, 8, 3)),
    "edge_fwd": ((128, 128, 32, 8, 3), (128, 256, 32, 8, 2), (64, 64, 32, 4, 2)),
    "edge_dx": ((64, 64, 64, 4, 3), (128, 64, 64, 8, 3), (64, 64, 128, 8, 3)),
    "edge_dw": ((64, 64, 64, 8, 3), (64, 128, 64, 8, 3), (32, 64, 64, 4, 3)),
}
_KERNELS = {
    "kan_fwd": _kan_fwd_kernel,
    "kan_dx": _kan_bwd_dx_kernel,
    "edge_fwd": _edge_fwd_kernel,
    "edge_dx": _edge_bwd_dx_kernel,
    "edge_dw": _edge_bwd_dw_kernel,
}


@kernel_table(_KERNELS)
def _autotuned(name: str) -> TunedKernel:
    """The CUDA kernel autotuned over its tiles, keyed on N, K, G and the rows (`programs` = tuned.programs_key(M),
    which only the key reads)."""
    reset = ["part_ptr"] if name == "kan_dx" else None  # row blocks a discarded config wrote must read 0
    tune = triton.autotune(configs=_configs(TILES[name]), key=["N", "K", "G", "programs"], reset_to_zero=reset)
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
    rbf_triton.require_device(x2d, "the fused KAN kernels")
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
            *weight.stride(), *y.stride(), scale, shift, G=G, SHARED=not stride_gw, DOT=_dot_precision(weight.dtype),
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
    """(dx in x's dtype, grid-weight grad fp32 [1 or K, G], dW in W's dtype); the first two come together. One kernel
    writes dx and the grid weights' gradient shares and, where dW is asked for, psi(x) in W's dtype; dW = dy^T psi is
    then a cuBLAS GEMM (psi lives only for it)."""
    M, K, N = _shapes(x2d, weight, 1)
    gw32, stride_gw = _grid_weight_rows(gw, K)
    G = gw32.shape[1]
    scale, shift, dx_scale = _grid_constants(grid_min, grid_max, G)
    dy = dy.to(weight.dtype)
    dx = torch.empty(M, K, device=x2d.device, dtype=x2d.dtype) if need_dx else x2d.new_empty(0)
    part_shape = _dx_part_shape(M, K, G, stride_gw) if need_dx else (0,)
    part = torch.zeros(part_shape, device=x2d.device, dtype=torch.float32)
    psi = torch.empty(M, K, device=x2d.device, dtype=weight.dtype) if need_dw else x2d.new_empty(0)
    if M and (need_dx or need_dw):
        _launch(
            "kan_dx", (M, K), "MK", x2d, gw32, weight, dy, dx, part, psi, M, N, K, programs_key(M),
            *x2d.stride(), stride_gw, *weight.stride(), *dy.stride(), *_strides(dx), 1 if stride_gw else part.stride(0),
            *_strides(psi),
            scale, shift, dx_scale, G=G, SHARED=not stride_gw, DX=need_dx, PSI=need_dw,
            DOT=_dot_precision(weight.dtype),
        )  # fmt: skip
    dgw = (part.sum(0) if stride_gw else part.sum(1).unsqueeze(0)) if need_dx else None
    dw = None
    if need_dw:
        with torch.autocast(x2d.device.type, enabled=False):  # in W's dtype, the dtype of dy and psi
            dw = dy.T @ psi
    return (dx if need_dx else None), dgw, dw


def _strides(t: torch.Tensor) -> tuple[int, int]:
    """The row and column strides of a [rows, cols] output (0, 0 for an empty stand-in the kernel never writes)."""
    return tuple(t.stride()) if t.dim() == 2 else (0, 0)


def _dx_part_shape(M: int, K: int, G: int, stride_gw: int) -> tuple[int, ...]:
    """The dx kernel's grid-weight gradient shares, enough for every candidate tile (zeros where the chosen one
    writes none): [row blocks, K, G] per channel; for one shared row [G, programs], so that the sum over the programs
    runs along contiguous rows (summed along a narrow tensor's first axis it took 0.02 ms on an H200)."""
    tiles = (
        [(_INTERP_META["BLOCK_M"], _INTERP_META["BLOCK_K"])] if INTERPRET else [(t[0], t[2]) for t in TILES["kan_dx"]]
    )
    if stride_gw:
        return cdiv(M, min(m for m, _ in tiles)), K, G
    return G, max(cdiv(M, m) * cdiv(K, k) for m, k in tiles)


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
