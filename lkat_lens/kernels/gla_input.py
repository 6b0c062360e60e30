"""GLA's input path for one of q, k, v as one Triton kernel: short causal convolution, SiLU, per-head RMSNorm, RoPE.

For x [B, T, D] (a projection's output, any strides), a depthwise causal convolution weight w [D, 1, TAPS], heads
of DH = D / H channels, and optionally an RMSNorm weight [DH] and per-channel rotary tables cos, sin [T, DH]:
    u_t = sum_j w[:, j] * x_{t - TAPS + 1 + j}     (x before the sequence start is 0)
    y   = SiLU(u)                                   per head [B, T, H, DH]
    y   = y * rsqrt(mean(y^2) + eps) * norm_weight  (with a norm weight)
    y   = y * cos + turn(y) * sin                   (with tables; turn(y) = (-y_1, y_0, -y_3, y_2, ...))
Both 2D RoPE layouts (models/rope.py) are this rotation with their own tables; rows past the patches have cos 1
and sin 0. Everything is computed in fp32 and stored once in x's dtype: no intermediate is written.

The backward is one kernel. A program recomputes u from x on a tile of BT rows, takes the output gradient back
through the rotation (turn^T = -turn), the norm and the SiLU to du = dL/du (fp32, in registers), and applies the
transposed convolution dx_t = sum_j w[:, j] * du_{t + TAPS - 1 - j} by shifting rows of that tile: it owns (writes dx
and weight-gradient partials for) the first BT - TAPS + 1 rows, the last TAPS - 1 are the halo its rows need, so du
never goes to memory. A program walks several such tiles of one sequence (`backward_tiles`): with up to ACC_TAPS
taps it accumulates the weight-gradient products over them and sums once. The per-program partial sums of the
convolution and norm weight gradients are summed on the host in a fixed order (deterministic, no atomics). Only x is
saved.

GLA's core (`gla_core`) takes q, k and v from one stacked projection output: `gla_qkv_fwd` / `gla_qkv_bwd` run the
same programs for all three in one launch each way (a third grid axis picks the piece: q and k with their norm
weights and the rotation, v with neither; v apart where its heads are wider or narrower than q's) and sum the
weight-gradient partials of all three in one reduction: two launches instead of six a layer, fewer host calls.

On CUDA the kernels are autotuned over warps (the forward also over row tiles); with TRITON_INTERPRET=1 in the
environment before triton is first imported they run on CPU tensors with a fixed configuration. The op is a torch
custom op, so torch.compile keeps it in the graph as one opaque call. `gla_input_reference` is the exact torch form.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .autograd_ops import ANY_STRIDES, Kernel, differentiable
from .dtypes import compute_dtype
from .host_math import cdiv, next_power_of_2
from .tuned import TunedKernel, kernel_table, programs_key, written_through

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INTERP_ROWS = 16
# The most taps whose weight-gradient products the backward accumulates over several row tiles (one register tile
# per tap), and the widest convolution the kernels take (the backward's halo of TAPS - 1 rows under half its tile).
ACC_TAPS, MAX_TAPS = 4, 16


def turn(y: torch.Tensor) -> torch.Tensor:
    """Each channel pair rotated by 90 degrees: (y_0, y_1, y_2, y_3, ...) -> (-y_1, y_0, -y_3, y_2, ...)."""
    even, odd = y.unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack([-odd, even], dim=-1).flatten(-2)


def gla_input_reference(
    x: torch.Tensor,
    conv_weight: torch.Tensor,
    norm_weight: torch.Tensor | None,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    heads: int,
    eps: float,
) -> torch.Tensor:
    """The exact torch form [B, T, H, DH], computed in fp32 (fp64 for fp64 x) and returned in x's dtype."""
    dtype = compute_dtype(x)
    taps, length = conv_weight.shape[-1], x.shape[1]
    padded = F.pad(x.to(dtype), (0, 0, taps - 1, 0))
    weight = conv_weight.reshape(-1, taps).to(dtype)
    y = F.silu(sum(padded[:, j : j + length] * weight[:, j] for j in range(taps))).unflatten(-1, (heads, -1))
    if norm_weight is not None:
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.to(dtype)
    if cos is not None:
        y = y * cos[:, None].to(dtype) + turn(y) * sin[:, None].to(dtype)
    return y.to(x.dtype)


@triton.jit
def _turn(y, BT: tl.constexpr, BD: tl.constexpr):
    """turn(y) of a [BT, BD] tile: (-y_1, y_0, -y_3, y_2, ...) along the columns."""
    even, odd = tl.split(tl.reshape(y, (BT, BD // 2, 2)))
    return tl.reshape(tl.join(-odd, even), (BT, BD))


@triton.jit
def _program_tile(H, DH: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr, STEP: tl.constexpr):
    """This program's (row block, batch * head) indices, sequence i_b, its BT rows (blocks start STEP rows apart),
    head columns c (0..BD), their mask and their columns in the [B, T, D] tensors."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = (i_bh // H).to(tl.int64), i_bh % H
    rows = i_t * STEP + tl.arange(0, BT)
    c = tl.arange(0, BD)
    return i_t, i_bh, i_b, rows, c, c < DH, i_h * DH + c


@triton.jit
def _rows_of(x_ptr, sx0, sx1, sx2, i_b, src, cols, col_ok, T):
    """Rows `src` (zero outside [0, T)) and columns `cols` of sequence i_b of a [B, T, D] tensor, as fp32."""
    ok = ((src >= 0) & (src < T))[:, None] & col_ok[None, :]
    offs = i_b * sx0 + src[:, None] * sx1 + cols[None, :] * sx2
    return tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _store_rows(ptr, s0, s1, s2, i_b, rows, cols, col_ok, T, value):
    """Write value into rows `rows` (those before T) and columns `cols` of sequence i_b, in the tensor's dtype."""
    offs = i_b * s0 + rows[:, None] * s1 + cols[None, :] * s2
    tl.store(ptr + offs, value.to(ptr.dtype.element_ty), mask=(rows < T)[:, None] & col_ok[None, :])


@triton.jit
def _table(ptr, rows, c, col_ok, T, DH: tl.constexpr):
    """Rows `rows` of a rotary table [T, DH] (fp32, contiguous)."""
    return tl.load(ptr + rows[:, None] * DH + c[None, :], mask=(rows < T)[:, None] & col_ok[None, :], other=0.0)


@triton.jit
def _tap_weight(w_ptr, cols, col_ok, j: tl.constexpr, TAPS: tl.constexpr):
    """Tap j of the convolution weight [D, TAPS] (contiguous) at columns `cols`, as fp32 [BD]."""
    return tl.load(w_ptr + cols * TAPS + j, mask=col_ok, other=0.0).to(tl.float32)


@triton.jit
def _conv(
    x_ptr, sx0, sx1, sx2, w_ptr, i_b, rows, cols, col_ok, T, TAPS: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr
):
    """u_t = sum_j w[:, j] * x_{t - TAPS + 1 + j} at `rows`, columns `cols`: the causal depthwise convolution."""
    acc = tl.zeros((BT, BD), dtype=tl.float32)
    for j in tl.static_range(TAPS):
        x = _rows_of(x_ptr, sx0, sx1, sx2, i_b, rows + (j - (TAPS - 1)), cols, col_ok, T)
        acc += x * _tap_weight(w_ptr, cols, col_ok, j, TAPS)[None, :]
    return acc


@triton.jit
def _rows_ahead(tile, shift: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """Row r + shift of a [BT, BD] tile at each row r (rows past the tile read its last row)."""
    if shift == 0:
        return tile
    source = tl.minimum(tl.arange(0, BT) + shift, BT - 1)
    return tl.gather(tile, tl.broadcast_to(source[:, None], (BT, BD)), axis=0)


@triton.jit
def _inv_rms(y, eps, DH: tl.constexpr):
    """1 / sqrt(mean(y^2) + eps) per row of a tile whose columns past DH are zero."""
    # in fp32: torch.compile passes a Python float as fp64 (tuned.py)
    return 1.0 / tl.sqrt(tl.sum(y * y, axis=1) / DH + tl.cast(eps, tl.float32))


@triton.jit
def _input_rows(
    x_ptr, w_ptr, nw_ptr, cos_ptr, sin_ptr, out_ptr, sx0, sx1, sx2, so0, so1, so2, i_b, rows, c, col_ok, cols, T, eps,
    DH: tl.constexpr, BD: tl.constexpr, TAPS: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr, BT: tl.constexpr,
):  # fmt: skip
    """The output at rows `rows` and head columns `cols` of sequence i_b: convolution, SiLU, the norm, the rotation."""
    u = _conv(x_ptr, sx0, sx1, sx2, w_ptr, i_b, rows, cols, col_ok, T, TAPS, BT, BD)
    y = u * tl.sigmoid(u)
    if NORM:
        y = y * _inv_rms(y, eps, DH)[:, None] * tl.load(nw_ptr + c, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if ROPE:
        cos, sin = _table(cos_ptr, rows, c, col_ok, T, DH), _table(sin_ptr, rows, c, col_ok, T, DH)
        y = y * cos + _turn(y, BT, BD) * sin
    _store_rows(out_ptr, so0, so1, so2, i_b, rows, cols, col_ok, T, y)


@triton.jit
def _gla_input_fwd_kernel(
    x_ptr, w_ptr, nw_ptr, cos_ptr, sin_ptr, out_ptr, sx0, sx1, sx2, so0, so1, so2, T, H, eps, programs,
    DH: tl.constexpr, BD: tl.constexpr, TAPS: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr,
    BT: tl.constexpr,
):  # fmt: skip
    """The output of BT rows of one (batch, head); so* are the output's [B, T, D] strides; `programs` is only the
    autotuning key."""
    _, _, i_b, rows, c, col_ok, cols = _program_tile(H, DH, BD, BT, BT)
    _input_rows(x_ptr, w_ptr, nw_ptr, cos_ptr, sin_ptr, out_ptr, sx0, sx1, sx2, so0, so1, so2, i_b, rows, c, col_ok,
                cols, T, eps, DH, BD, TAPS, NORM, ROPE, BT)  # fmt: skip


@triton.jit
def _gla_qkv_fwd_kernel(
    x_ptr, wq_ptr, wk_ptr, wv_ptr, nq_ptr, nk_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, sx0, sx1, sx2, so0, so1, so2,
    T, H, eps_q, eps_k, programs, DH: tl.constexpr, BD: tl.constexpr, TAPS: tl.constexpr, BT: tl.constexpr,
):  # fmt: skip
    """q and k (norm and rotation), and v (neither) in a third program row, of BT rows of one (batch, head): piece p
    = program_id(2) reads x's columns from p * H * DH on; the outputs share the strides so*."""
    _, _, i_b, rows, c, col_ok, cols = _program_tile(H, DH, BD, BT, BT)
    piece = tl.program_id(2)
    x_ptr += piece.to(tl.int64) * (H * DH) * sx2
    if piece == 2:
        _input_rows(x_ptr, wv_ptr, wv_ptr, cos_ptr, sin_ptr, v_ptr, sx0, sx1, sx2, so0, so1, so2, i_b, rows, c,
                    col_ok, cols, T, eps_q, DH, BD, TAPS, False, False, BT)  # fmt: skip
    else:
        w_ptr, nw_ptr, out_ptr, eps = wq_ptr, nq_ptr, q_ptr, eps_q
        if piece == 1:
            w_ptr, nw_ptr, out_ptr, eps = wk_ptr, nk_ptr, k_ptr, eps_k
        _input_rows(x_ptr, w_ptr, nw_ptr, cos_ptr, sin_ptr, out_ptr, sx0, sx1, sx2, so0, so1, so2, i_b, rows, c,
                    col_ok, cols, T, eps, DH, BD, TAPS, True, True, BT)  # fmt: skip


@triton.jit
def _tile_du(
    x_ptr, w_ptr, nw_ptr, cos_ptr, sin_ptr, do_ptr, sx0, sx1, sx2, sd0, sd1, sd2, i_b, rows, c, cols, col_ok, owned,
    T, eps, DH: tl.constexpr, BD: tl.constexpr, TAPS: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr,
    BT: tl.constexpr,
):  # fmt: skip
    """du = dL/du on a tile of BT rows (zero past T, where the output gradient is zero) and the norm weight's
    gradient products on its owned rows (zero without a norm). The output gradient and the rotary tables are loaded
    before x, so that their loads are in flight during the convolution's."""
    dm = _rows_of(do_ptr, sd0, sd1, sd2, i_b, rows, cols, col_ok, T)
    if ROPE:
        cos, sin = _table(cos_ptr, rows, c, col_ok, T, DH), _table(sin_ptr, rows, c, col_ok, T, DH)
    u = _conv(x_ptr, sx0, sx1, sx2, w_ptr, i_b, rows, cols, col_ok, T, TAPS, BT, BD)
    s = tl.sigmoid(u)
    y = u * s
    if ROPE:
        dm = dm * cos - _turn(dm * sin, BT, BD)
    norm_products = tl.zeros((BT, BD), dtype=tl.float32)
    if NORM:
        r = _inv_rms(y, eps, DH)[:, None]
        n = y * r
        norm_products = tl.where(owned, dm * n, 0.0)
        dn = dm * tl.load(nw_ptr + c, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        dm = r * (dn - n * (tl.sum(dn * n, axis=1) / DH)[:, None])
    return dm * (s + y * (1.0 - s)), norm_products


@triton.jit
def _store_tap_sum(dw_ptr, products, j: tl.constexpr, TAPS: tl.constexpr, cols, col_ok, slots, slot):
    """Tap j's weight-gradient partial: the column sums of its products, at dw_ptr [D, TAPS, slots]."""
    tl.store(dw_ptr + (cols * TAPS + j) * slots + slot, tl.sum(products, axis=0), mask=col_ok)


@triton.jit
def _input_grads(
    x_ptr, w_ptr, nw_ptr, cos_ptr, sin_ptr, do_ptr, dx_ptr, dw_ptr, dnw_ptr, sx0, sx1, sx2, sd0, sd1, sd2, sdx0, sdx1,
    sdx2, T, H, eps, DH: tl.constexpr, BD: tl.constexpr, TAPS: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr,
    BT: tl.constexpr, TILES: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """The backward program of `_gla_input_bwd_kernel` (which see) on these pointers."""
    OWN: tl.constexpr = BT - (TAPS - 1)
    i_g, i_bh, i_b, _, c, col_ok, cols = _program_tile(H, DH, BD, BT, OWN)
    slots = tl.num_programs(0) * (tl.num_programs(1) // H)  # (row group, sequence) pairs
    slot = i_g * (slots // tl.num_programs(0)) + i_b
    owned = (tl.arange(0, BT) < OWN)[:, None]
    acc0 = tl.zeros((BT, BD), dtype=tl.float32)
    acc1 = tl.zeros((BT, BD), dtype=tl.float32)
    acc2 = tl.zeros((BT, BD), dtype=tl.float32)
    acc3 = tl.zeros((BT, BD), dtype=tl.float32)
    acc_norm = tl.zeros((BT, BD), dtype=tl.float32)
    for i in range(TILES):
        start = (i_g * TILES + i) * OWN
        rows = start + tl.arange(0, BT)
        du, norm_products = _tile_du(
            x_ptr, w_ptr, nw_ptr, cos_ptr, sin_ptr, do_ptr, sx0, sx1, sx2, sd0, sd1, sd2, i_b, rows, c, cols, col_ok,
            owned, T, eps, DH, BD, TAPS, NORM, ROPE, BT,
        )  # fmt: skip
        acc_norm += norm_products
        du_owned = tl.where(owned, du, 0.0)
        dx = tl.zeros((BT, BD), dtype=tl.float32)
        for j in tl.static_range(TAPS):
            products = du_owned * _rows_of(x_ptr, sx0, sx1, sx2, i_b, rows - (TAPS - 1 - j), cols, col_ok, T)
            if not ACC:
                _store_tap_sum(dw_ptr, products, j, TAPS, cols, col_ok, slots, slot)
            elif j == 0:
                acc0 += products
            elif j == 1:
                acc1 += products
            elif j == 2:
                acc2 += products
            else:
                acc3 += products
            dx += _rows_ahead(du, TAPS - 1 - j, BT, BD) * _tap_weight(w_ptr, cols, col_ok, j, TAPS)[None, :]
        _store_rows(dx_ptr, sdx0, sdx1, sdx2, i_b, rows, cols, col_ok, tl.minimum(T, start + OWN), dx)
    if ACC:
        _store_tap_sum(dw_ptr, acc0, 0, TAPS, cols, col_ok, slots, slot)
        if TAPS > 1:
            _store_tap_sum(dw_ptr, acc1, 1, TAPS, cols, col_ok, slots, slot)
        if TAPS > 2:
            _store_tap_sum(dw_ptr, acc2, 2, TAPS, cols, col_ok, slots, slot)
        if TAPS > 3:
            _store_tap_sum(dw_ptr, acc3, 3, TAPS, cols, col_ok, slots, slot)
    if NORM:
        n_programs = tl.num_programs(0) * tl.num_programs(1)
        tl.store(dnw_ptr + c * n_programs + i_g * tl.num_programs(1) + i_bh, tl.sum(acc_norm, axis=0), mask=col_ok)


@triton.jit
def _gla_input_bwd_kernel(
    x_ptr, w_ptr, nw_ptr, cos_ptr, sin_ptr, do_ptr, dx_ptr, dw_ptr, dnw_ptr, sx0, sx1, sx2, sd0, sd1, sd2, sdx0, sdx1,
    sdx2, dx_offset, T, H, eps, programs, DH: tl.constexpr, BD: tl.constexpr, TAPS: tl.constexpr, NORM: tl.constexpr,
    ROPE: tl.constexpr, BT: tl.constexpr, TILES: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """dx ([B, T, D] from dx_offset, strides sdx*) of the rows of one (batch, head) that this program owns: TILES
    consecutive tiles of BT rows, each owning its first BT - TAPS + 1. With it the partial sums of the convolution
    weight gradient (dw_ptr [D, TAPS, programs along the rows * B]) and of the norm weight's (dnw_ptr [DH, programs]):
    partials last, so that the host sums contiguous rows. With ACC (at most four taps) each tap's products are
    accumulated over the tiles and summed once; without it (TILES == 1) each is summed on its tile. sd* are the output
    gradient's [B, T, D] strides; `programs` is only the autotuning key."""
    _input_grads(x_ptr, w_ptr, nw_ptr, cos_ptr, sin_ptr, do_ptr, dx_ptr + dx_offset, dw_ptr, dnw_ptr, sx0, sx1, sx2,
                 sd0, sd1, sd2, sdx0, sdx1, sdx2, T, H, eps, DH, BD, TAPS, NORM, ROPE, BT, TILES, ACC)  # fmt: skip


@triton.jit
def _gla_qkv_bwd_kernel(
    x_ptr, wq_ptr, wk_ptr, wv_ptr, nq_ptr, nk_ptr, cos_ptr, sin_ptr, dq_ptr, dk_ptr, dv_ptr, dx_ptr, dw_ptr, dnw_ptr,
    sx0, sx1, sx2, sd0, sd1, sd2, sdx0, sdx1, sdx2, T, H, eps_q, eps_k, programs, DH: tl.constexpr, BD: tl.constexpr,
    TAPS: tl.constexpr, BT: tl.constexpr, TILES: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """`_gla_input_bwd_kernel` for q, k and (a third program row) v at once, as `_gla_qkv_fwd_kernel` reads them:
    piece p = program_id(2) writes dx's columns from p * H * DH on, its weight-gradient partials at dw_ptr[p] ([pieces,
    D, TAPS, slots]) and q's and k's norm partials at dnw_ptr[p] ([2, DH, programs]); the output gradients dq, dk, dv
    share the strides sd*."""
    piece = tl.program_id(2)
    D = H * DH
    offset = piece.to(tl.int64) * D
    x_ptr += offset * sx2
    dx_ptr += offset * sdx2
    dw_ptr += offset * (TAPS * tl.num_programs(0) * (tl.num_programs(1) // H))
    if piece == 2:
        _input_grads(x_ptr, wv_ptr, wv_ptr, cos_ptr, sin_ptr, dv_ptr, dx_ptr, dw_ptr, dnw_ptr, sx0, sx1, sx2, sd0, sd1,
                     sd2, sdx0, sdx1, sdx2, T, H, eps_q, DH, BD, TAPS, False, False, BT, TILES, ACC)  # fmt: skip
    else:
        w_ptr, nw_ptr, do_ptr, eps = wq_ptr, nq_ptr, dq_ptr, eps_q
        if piece == 1:
            w_ptr, nw_ptr, do_ptr, eps = wk_ptr, nk_ptr, dk_ptr, eps_k
            dnw_ptr += DH * tl.num_programs(0) * tl.num_programs(1)
        _input_grads(x_ptr, w_ptr, nw_ptr, cos_ptr, sin_ptr, do_ptr, dx_ptr, dw_ptr, dnw_ptr, sx0, sx1, sx2, sd0, sd1,
                     sd2, sdx0, sdx1, sdx2, T, H, eps, DH, BD, TAPS, True, True, BT, TILES, ACC)  # fmt: skip


# Tuned per shape and batch (heads, rows and programs = tuned.programs_key(B, H) in the key): without heads and rows
# a test's small shape gave LKAT-S's backward 4 warps in the model, 0.141 ms a call where 2 take 0.106 (H100); without
# the batch a test's batch of 2 gave LKAT-T's batch of 128 its warps (the q, k, v paths 0.255 against 0.221 ms, H200).
_KEY = ["DH", "TAPS", "H", "T", "programs"]
_KERNELS = {
    "forward": (_gla_input_fwd_kernel, ["NORM", "ROPE"]),
    "backward": (_gla_input_bwd_kernel, ["NORM", "ROPE"]),
    "qkv_forward": (_gla_qkv_fwd_kernel, []),
    "qkv_backward": (_gla_qkv_bwd_kernel, []),
}


@kernel_table(_KERNELS)
def _autotuned(kernel_name: str) -> TunedKernel:
    """A kernel autotuned on CUDA: the forwards over (row tile, warps), the backwards over warps (their tiles set by
    `backward_tiles`)."""
    kernel, flags = _KERNELS[kernel_name]
    if kernel_name.endswith("forward"):
        configs = [triton.Config({"BT": bt}, num_warps=w) for bt in (16, 32, 64) for w in (2, 4)]
    else:
        configs = [triton.Config({}, num_warps=w) for w in (1, 2, 4, 8)]
    return TunedKernel(triton.autotune(configs=configs, key=_KEY + flags)(kernel))


def _launch(kernel_name: str, blocks, B: int, H: int, pieces: int, *args, **meta) -> None:
    """Launch kernel `kernel_name` over (blocks(BT) row blocks, B * H, pieces): the interpreter with a fixed
    configuration (the forwards' row tile _INTERP_ROWS), CUDA autotuned."""
    if INTERPRET:
        meta = {"BT": _INTERP_ROWS} | meta
        _KERNELS[kernel_name][0][(blocks(meta["BT"]), B * H, pieces)](*args, **meta)
    else:
        _autotuned(kernel_name)[lambda m: (blocks(m["BT"]), B * H, pieces)](*args, **meta)


def backward_tiles(taps: int) -> tuple[int, int]:
    """(rows per tile, tiles per program) of the backward: 16-row tiles, 8 per program with their weight-gradient
    products accumulated, up to ACC_TAPS taps (5-20 % faster than one 32-row tile per program at LKAT-T/S/B's shapes
    and LKAT-S at 1024², H100); one 32-row tile per program beyond, which keeps the halo of TAPS - 1 rows under half
    of it."""
    return (16, 8) if taps <= ACC_TAPS else (32, 1)


def _meta(width: int, heads: int, taps: int) -> dict:
    """The kernels' constexpr meta-parameters for heads of width / heads channels and `taps` convolution taps."""
    head_dim = width // heads
    return dict(DH=head_dim, BD=next_power_of_2(head_dim), TAPS=taps)


def _tiling(T: int, taps: int) -> tuple[int, dict]:
    """(programs along the rows, the backward kernels' tiling meta-parameters) for T rows (backward_tiles)."""
    rows, tiles = backward_tiles(taps)
    return cdiv(cdiv(T, rows - (taps - 1)), tiles), dict(BT=rows, TILES=tiles, ACC=taps <= ACC_TAPS)


def _conv_operand(conv_weight: torch.Tensor) -> torch.Tensor:
    """A convolution weight [D, 1, TAPS] as the kernels read it, contiguous [D, TAPS] memory: the weight itself when
    contiguous (no view to dispatch: one less host op a launch), else a contiguous copy."""
    return conv_weight if conv_weight.is_contiguous() else conv_weight.reshape(conv_weight.shape[0], -1).contiguous()


def _operands(x, conv_weight, norm_weight, cos, sin, heads: int) -> tuple[tuple[torch.Tensor, ...], dict]:
    """The kernels' weight operands (the conv weight (_conv_operand), then the optional ones as contiguous fp32
    tensors, x itself as a placeholder where absent: never read) and their constexpr meta-parameters."""
    weight = _conv_operand(conv_weight)
    optional = tuple(x if t is None else t.float().contiguous() for t in (norm_weight, cos, sin))
    meta = _meta(x.shape[-1], heads, conv_weight.shape[-1])
    return (weight, *optional), meta | dict(NORM=norm_weight is not None, ROPE=cos is not None)


def gla_input_fwd(x, conv_weight, norm_weight, cos, sin, heads: int, eps: float) -> torch.Tensor:
    """The output [B, T, H, DH] in x's dtype."""
    B, T, D = x.shape
    out = torch.empty(B, T, heads, D // heads, dtype=x.dtype, device=x.device)
    if out.numel():
        weights, meta = _operands(x, conv_weight, norm_weight, cos, sin, heads)
        args = (x, *weights, out, *x.stride(), *out.flatten(2).stride(), T, heads, eps, programs_key(B, heads))
        _launch("forward", lambda bt: cdiv(T, bt), B, heads, 1, *args, **meta)
    return out


def gla_input_bwd(
    x,
    conv_weight,
    norm_weight,
    cos,
    sin,
    do,
    heads: int,
    eps: float,
    dx: torch.Tensor | None = None,
    dx_into: tuple[torch.Tensor, int] | None = None,
) -> tuple[torch.Tensor, ...]:
    """(dx in x's dtype, d conv_weight, d norm_weight (empty without a norm weight)) for the output gradient do; dx is
    written into `dx` when given (a [B, T, D] tensor of any strides, such as a column slice of a wider gradient: pass
    that gradient and the slice's offset as dx_into, tuned.written_through)."""
    B, T, D = x.shape
    taps = conv_weight.shape[-1]
    norm = norm_weight is not None
    groups, tiling = _tiling(T, taps)
    dw = torch.empty(D, taps, groups * B, dtype=torch.float32, device=x.device)
    dnw = torch.empty(D // heads, groups * B * heads if norm else 0, dtype=torch.float32, device=x.device)
    if dx is None:
        dx = torch.empty(B, T, D, dtype=x.dtype, device=x.device)
    if dx.numel():  # else the empty partials sum to zero gradients
        weights, meta = _operands(x, conv_weight, norm_weight, cos, sin, heads)
        target, offset = written_through(dx, dx_into)
        strides = (*x.stride(), *do.flatten(2).stride(), *dx.stride(), offset)
        args = (x, *weights, do.flatten(2), target, dw, dnw, *strides, T, heads, eps, programs_key(B, heads))
        _launch("backward", lambda bt: groups, B, heads, 1, *args, **meta, **tiling)
    d_conv = dw.sum(-1).reshape(conv_weight.shape).to(conv_weight.dtype)
    d_norm = dnw.sum(-1).to(norm_weight.dtype) if norm else dnw.new_empty(0, D // heads)
    return dx, d_conv, d_norm


def qkv_pieces(convs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> int:
    """How many of q, k, v one launch of the q/k/v kernels takes: all three where v's convolution weight has q's shape
    (heads of q's width), else q and k (v then takes the single-input kernels). q's and k's weights share a shape."""
    if convs[1].shape != convs[0].shape:
        shapes = f"{tuple(convs[0].shape)} and {tuple(convs[1].shape)}"
        raise ValueError(f"q's and k's convolution weights must have one shape, got {shapes}")
    return 3 if convs[2].shape == convs[0].shape else 2


def _qkv_operands(convs, norms, cos, sin) -> tuple[torch.Tensor, ...]:
    """The q/k/v kernels' weight operands: the three convolution weights as contiguous [D, TAPS] (_conv_operand),
    then the q and k norm weights and the rotary tables as contiguous fp32 tensors."""
    return (*map(_conv_operand, convs), *(t.float().contiguous() for t in (*norms, cos, sin)))


def gla_qkv_fwd(y, convs, norms, cos, sin, heads: int, eps: tuple[float, float]) -> tuple[torch.Tensor, ...]:
    """q, k and v [B, T, H, *] in y's dtype from y [B, T, >= 2 K + V] whose first columns are q's, k's and v's inputs,
    each as gla_input_fwd computes it (q and k with their norm weights and the rotation, v with neither), in one launch
    (qkv_pieces). convs: the three convolution weights [D, 1, TAPS] of equal taps; eps: q_norm's and k_norm's."""
    B, T, _ = y.shape
    key_dim, value_dim, taps = convs[0].shape[0], convs[2].shape[0], convs[0].shape[-1]
    pieces = qkv_pieces(convs)
    q, k = (torch.empty(B, T, heads, key_dim // heads, dtype=y.dtype, device=y.device) for _ in range(2))
    if pieces == 3:
        v = torch.empty_like(q)
    else:
        v = gla_input_fwd(y[..., 2 * key_dim : 2 * key_dim + value_dim], convs[2], None, None, None, heads, 0.0)
    if q.numel():
        out_strides = (T * key_dim, key_dim, 1)
        args = (y, *_qkv_operands(convs, norms, cos, sin), q, k, v, *y.stride(), *out_strides, T, heads, *eps)
        meta = _meta(key_dim, heads, taps)
        _launch("qkv_forward", lambda bt: cdiv(T, bt), B, heads, pieces, *args, programs_key(B, heads, pieces), **meta)
    return q, k, v


def gla_qkv_bwd(
    y, convs, norms, cos, sin, grads: tuple[torch.Tensor, ...], heads: int, eps: tuple[float, float], dx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(d conv, d conv_v, d norm) for the output gradients grads = (dq, dk, dv) of gla_qkv_fwd, writing the input
    gradients of q's, k's and v's columns into those columns of dx (y's shape, any strides). The weights' gradients
    come stacked, as their partial sums are summed, in one reduction each: d conv [pieces, D, 1, TAPS] (q's, k's and,
    with qkv_pieces 3, v's; else v's alone in d conv_v, None otherwise), d norm [2, DH] (q's and k's)."""
    B, T, _ = y.shape
    key_dim, value_dim, taps = convs[0].shape[0], convs[2].shape[0], convs[0].shape[-1]
    pieces = qkv_pieces(convs)
    dq, dk, dv = grads
    if dk.stride() != dq.stride() or (pieces == 3 and dv.stride() != dq.stride()):
        dq, dk, dv = (g.contiguous() for g in grads)
    groups, tiling = _tiling(T, taps)
    dw = torch.empty(pieces, key_dim, taps, groups * B, dtype=torch.float32, device=y.device)
    dnw = torch.empty(2, key_dim // heads, groups * B * heads, dtype=torch.float32, device=y.device)
    d_conv_v = None
    if pieces == 2:
        v_columns = slice(2 * key_dim, 2 * key_dim + value_dim)
        v_grads = gla_input_bwd(
            y[..., v_columns], convs[2], None, None, None, dv, heads, 0.0, dx[..., v_columns], (dx, 2 * key_dim)
        )
        d_conv_v = v_grads[1]
    if B * T:  # else the empty partials sum to zero gradients
        strides = (*y.stride(), *dq.flatten(2).stride(), *dx.stride())
        operands = _qkv_operands(convs, norms, cos, sin)
        args = (y, *operands, dq, dk, dv, dx, dw, dnw, *strides, T, heads, *eps, programs_key(B, heads, pieces))
        _launch("qkv_backward", lambda bt: groups, B, heads, pieces, *args, **_meta(key_dim, heads, taps), **tiling)
    d_conv = dw.sum(-1).view(pieces, *convs[0].shape).to(convs[0].dtype)
    return d_conv, d_conv_v, dnw.sum(-1).to(norms[0].dtype)


def supports(x: torch.Tensor, heads: int, rope: bool, taps: int) -> bool:
    """Whether the kernels take this input: a 16/32-bit [B, T, D] on CUDA (or the interpreter), D = heads * DH with
    DH even for RoPE, a convolution of at most MAX_TAPS taps."""
    if x.dim() != 3 or x.dtype not in INPUT_DTYPES or x.shape[-1] % heads or not (x.is_cuda or INTERPRET):
        return False
    return 1 <= taps <= MAX_TAPS and (not rope or (x.shape[-1] // heads) % 2 == 0)


# Both ops read x and the output gradient through their strides (x is a column slice of the projection output).
@torch.library.custom_op("lkat_lens::gla_input", mutates_args=(), tags=ANY_STRIDES)
def _gla_input_op(
    x: torch.Tensor,
    conv_weight: torch.Tensor,
    norm_weight: torch.Tensor | None,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    heads: int,
    eps: float,
) -> torch.Tensor:
    """The forward as a custom op (opaque to torch.compile)."""
    return gla_input_fwd(x, conv_weight, norm_weight, cos, sin, heads, eps)


@_gla_input_op.register_fake
def _gla_input_fake(x, conv_weight, norm_weight, cos, sin, heads, eps) -> torch.Tensor:
    return x.new_empty(*x.shape[:2], heads, x.shape[-1] // heads)


@torch.library.custom_op("lkat_lens::gla_input_backward", mutates_args=(), tags=ANY_STRIDES)
def _gla_input_backward_op(
    x: torch.Tensor,
    conv_weight: torch.Tensor,
    norm_weight: torch.Tensor | None,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    do: torch.Tensor,
    heads: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward as a custom op: (dx, d conv_weight, d norm_weight or an empty tensor)."""
    return gla_input_bwd(x, conv_weight, norm_weight, cos, sin, do, heads, eps)


@_gla_input_backward_op.register_fake
def _gla_input_backward_fake(x, conv_weight, norm_weight, cos, sin, do, heads, eps):
    d_norm = (
        x.new_empty(0, x.shape[-1] // heads, dtype=torch.float32)
        if norm_weight is None
        else torch.empty_like(norm_weight)
    )
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(conv_weight), d_norm


def _setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    x, conv_weight, norm_weight, cos, sin, heads, eps = inputs
    ctx.save_for_backward(x, conv_weight, norm_weight, cos, sin)
    ctx.heads, ctx.eps = heads, eps


def _backward(ctx, do: torch.Tensor, kernel) -> tuple:
    x, conv_weight, norm_weight, cos, sin = ctx.saved_tensors
    dx, d_conv, d_norm = kernel(x, conv_weight, norm_weight, cos, sin, do, ctx.heads, ctx.eps)
    return dx, d_conv, (None if norm_weight is None else d_norm), None, None, None, None


_gla_input = differentiable(
    Kernel(_gla_input_op, gla_input_fwd), Kernel(_gla_input_backward_op, gla_input_bwd), _backward, _setup_context
)


def gla_input(
    x: torch.Tensor,
    conv_weight: torch.Tensor,
    norm_weight: torch.Tensor | None = None,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    *,
    heads: int,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Differentiable conv + SiLU (+ RMSNorm) (+ RoPE) of x [B, T, D] as [B, T, heads, D / heads] in x's dtype.

    Gradients reach x, conv_weight and norm_weight (not the rotary tables)."""
    if (cos is None) != (sin is None):
        raise ValueError("give both rotary tables cos and sin, or neither")
    head_dim = x.shape[-1] // max(heads, 1)
    if cos is not None and (cos.shape != (x.shape[1], head_dim) or sin.shape != cos.shape):
        raise ValueError(f"rotary tables must be [T, head dim] = {(x.shape[1], head_dim)}, got {tuple(cos.shape)}")
    if not supports(x, heads, cos is not None, conv_weight.shape[-1]):
        raise ValueError(
            f"gla_input needs a [B, T, D] tensor in {INPUT_DTYPES} on CUDA (or the Triton interpreter) with D "
            f"divisible by heads ({heads}), heads of even width for RoPE, and 1 to {MAX_TAPS} convolution taps; got "
            f"{tuple(x.shape)} {x.dtype} on {x.device}, {conv_weight.shape[-1]} taps"
        )
    return _gla_input(x, conv_weight, norm_weight, cos, sin, heads, float(eps))
