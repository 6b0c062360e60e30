"""GLA's input path for q, k and v as one Triton kernel: short causal convolution, SiLU, q/k RMSNorm and RoPE.

x [B, T, 2 DK + DV] holds the q, k and v projections' outputs side by side (columns [0, DK), [DK, 2 DK), [2 DK,
2 DK + DV); any strides, such as a slice of the layer's stacked projection). With depthwise causal convolution
weights wq, wk [DK, 1, TAPS] and wv [DV, 1, TAPS], H heads of DH = DK / H (q, k) and DV / H (v) channels, RMSNorm
weights nq, nk [DH] and per-channel rotary tables cos, sin [T, DH]:
    u_t = sum_j w[:, j] * x_{t - TAPS + 1 + j}     (x before the sequence start is 0)
    y   = SiLU(u)                                   per head
    q, k: y = y * rsqrt(mean(y^2) + eps) * norm weight, then y * cos + turn(y) * sin (turn(y) = (-y_1, y_0, -y_3, ...))
Both 2D RoPE layouts (models/rope.py) are this rotation with their own tables; rows past the patches have cos 1
and sin 0. Everything is computed in fp32 and stored once in x's dtype: no intermediate is written. One launch
covers the three paths (its third grid axis), so a layer costs one forward and one backward kernel, and the
weight-gradient partials of all three are summed by two reductions.

The backward is one kernel. A program recomputes u from x on a tile of BT rows, takes the output gradient back
through the rotation (turn^T = -turn), the norm and the SiLU to du = dL/du (fp32, in registers), and applies the
transposed convolution dx_t = sum_j w[:, j] * du_{t + TAPS - 1 - j} by shifting rows of that tile: it owns (writes dx
and weight-gradient partials for) the first BT - TAPS + 1 rows, the last TAPS - 1 are the halo its rows need, so du
never goes to memory. The per-program partial sums of the convolution and norm weight gradients are summed on the
host in a fixed order (deterministic, no atomics). Only x is saved.

On CUDA the kernels are autotuned over warps (the forward also over row tiles); with TRITON_INTERPRET=1 in the
environment before triton is first imported they run on CPU tensors with a fixed configuration. The op is a torch
custom op, so torch.compile keeps it in the graph as one opaque call. `gla_inputs_reference` is the exact torch form,
`gla_input_reference` its one path.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .dtypes import compute_dtype

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Rows per program of the backward kernel, halo included (fixed: it sets the number of weight-gradient partials).
_BWD_ROWS = 32
_INTERP_ROWS = 16
# The widest convolution the kernels take (the backward's halo of TAPS - 1 rows stays under half its tile).
MAX_TAPS = _BWD_ROWS // 2


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


def gla_inputs_reference(
    x: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    wv: torch.Tensor,
    nq: torch.Tensor,
    nk: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k, v) of x [B, T, 2 DK + DV] by the exact torch form of each path."""
    xq, xk, xv = x.split([wq.shape[0], wk.shape[0], wv.shape[0]], dim=-1)
    return (
        gla_input_reference(xq, wq, nq, cos, sin, heads, eps),
        gla_input_reference(xk, wk, nk, cos, sin, heads, eps),
        gla_input_reference(xv, wv, None, None, None, heads, eps),
    )


@triton.jit
def _turn(y, BT: tl.constexpr, BD: tl.constexpr):
    """turn(y) of a [BT, BD] tile: (-y_1, y_0, -y_3, y_2, ...) along the columns."""
    even, odd = tl.split(tl.reshape(y, (BT, BD // 2, 2)))
    return tl.reshape(tl.join(-odd, even), (BT, BD))


@triton.jit
def _program_tile(H, DK, DH: tl.constexpr, DVH: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr, STEP: tl.constexpr):
    """This program's row block i_t, (batch * head) i_bh, path (0 q, 1 k, 2 v), sequence i_b, its BT rows (blocks
    start STEP rows apart), head columns c (0..BD), their mask (the path's head width) and their columns in x."""
    i_t, i_bh, path = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = (i_bh // H).to(tl.int64), i_bh % H
    rows = i_t * STEP + tl.arange(0, BT)
    c = tl.arange(0, BD)
    width = tl.where(path == 2, DVH, DH)
    return i_t, i_bh, path, i_b, rows, c, c < width, path * DK + i_h * width + c


@triton.jit
def _of_path(path, q_value, k_value, v_value):
    """q's, k's or v's value (pointers, strides) by the program's path."""
    if path == 0:
        value = q_value
    elif path == 1:
        value = k_value
    else:
        value = v_value
    return value


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
    x_ptr, sx0, sx1, sx2, w_ptr, i_b, rows, w_cols, cols, col_ok, T,
    TAPS: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    """u_t = sum_j w[:, j] * x_{t - TAPS + 1 + j} at `rows`, columns `cols` of x (`w_cols` of w): the causal depthwise
    convolution."""
    acc = tl.zeros((BT, BD), dtype=tl.float32)
    for j in tl.static_range(TAPS):
        x = _rows_of(x_ptr, sx0, sx1, sx2, i_b, rows + (j - (TAPS - 1)), cols, col_ok, T)
        acc += x * _tap_weight(w_ptr, w_cols, col_ok, j, TAPS)[None, :]
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
    return 1.0 / tl.sqrt(tl.sum(y * y, axis=1) / DH + eps)


@triton.jit
def _fwd_kernel(
    x_ptr, wq_ptr, wk_ptr, wv_ptr, nq_ptr, nk_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, sx0, sx1, sx2, T, H, DK,
    eps, DH: tl.constexpr, DVH: tl.constexpr, BD: tl.constexpr, TAPS: tl.constexpr, BT: tl.constexpr,
):  # fmt: skip
    """The output of BT rows of one (batch, head) of one path into q, k or v (contiguous [B, T, H, width])."""
    i_t, i_bh, path, i_b, rows, c, col_ok, cols = _program_tile(H, DK, DH, DVH, BD, BT, BT)
    w_ptr = _of_path(path, wq_ptr, wk_ptr, wv_ptr)
    u = _conv(x_ptr, sx0, sx1, sx2, w_ptr, i_b, rows, cols - path * DK, cols, col_ok, T, TAPS, BT, BD)
    y = u * tl.sigmoid(u)
    if path < 2:
        nw = tl.load(_of_path(path, nq_ptr, nk_ptr, nk_ptr) + c, mask=col_ok, other=0.0).to(tl.float32)
        y = y * _inv_rms(y, eps, DH)[:, None] * nw[None, :]
        cos, sin = _table(cos_ptr, rows, c, col_ok, T, DH), _table(sin_ptr, rows, c, col_ok, T, DH)
        y = y * cos + _turn(y, BT, BD) * sin
    width = tl.where(path == 2, DVH, DH)
    out_ptr = _of_path(path, q_ptr, k_ptr, v_ptr)
    _store_rows(out_ptr, T * H * width, H * width, 1, i_b, rows, cols - path * DK, col_ok, T, y)


@triton.jit
def _bwd_kernel(
    x_ptr, wq_ptr, wk_ptr, wv_ptr, nq_ptr, nk_ptr, cos_ptr, sin_ptr, dq_ptr, dk_ptr, dv_ptr, dx_ptr, dw_ptr, dnw_ptr,
    sx0, sx1, sx2, sq0, sq1, sq2, sk0, sk1, sk2, sv0, sv1, sv2, T, H, DK, D, eps,
    DH: tl.constexpr, DVH: tl.constexpr, BD: tl.constexpr, TAPS: tl.constexpr, BT: tl.constexpr,
):  # fmt: skip
    """dx ([B, T, D] contiguous, D = 2 DK + DV) of the BT - TAPS + 1 rows of one (batch, head) of one path that this
    program owns, with its partial sums of the convolution weight gradient (dw_ptr [D, TAPS, row blocks * B]) and,
    for q and k, of the norm weight's (dnw_ptr [2, DH, row blocks * B * H]): partials last, so that the host sums
    contiguous rows. s{q,k,v}* are the output gradients' [B, T, width] strides. du is computed on all BT rows (zero
    past T, where the output gradient is zero)."""
    OWN: tl.constexpr = BT - (TAPS - 1)
    i_t, i_bh, path, i_b, rows, c, col_ok, cols = _program_tile(H, DK, DH, DVH, BD, BT, OWN)
    blocks, programs = tl.num_programs(0), tl.num_programs(0) * tl.num_programs(1)
    owned = (tl.arange(0, BT) < OWN)[:, None]
    w_ptr = _of_path(path, wq_ptr, wk_ptr, wv_ptr)
    w_cols = cols - path * DK  # columns in the path's own weight and output gradient
    u = _conv(x_ptr, sx0, sx1, sx2, w_ptr, i_b, rows, w_cols, cols, col_ok, T, TAPS, BT, BD)
    s = tl.sigmoid(u)
    y = u * s
    d_ptr = _of_path(path, dq_ptr, dk_ptr, dv_ptr)
    dm = _rows_of(
        d_ptr, _of_path(path, sq0, sk0, sv0), _of_path(path, sq1, sk1, sv1), _of_path(path, sq2, sk2, sv2),
        i_b, rows, w_cols, col_ok, T,
    )  # fmt: skip
    if path < 2:
        cos, sin = _table(cos_ptr, rows, c, col_ok, T, DH), _table(sin_ptr, rows, c, col_ok, T, DH)
        dm = dm * cos - _turn(dm * sin, BT, BD)
        r = _inv_rms(y, eps, DH)[:, None]
        n = y * r
        d_norm = tl.sum(tl.where(owned, dm * n, 0.0), axis=0)
        tl.store(dnw_ptr + (path * DH + c) * programs + i_t * tl.num_programs(1) + i_bh, d_norm, mask=col_ok)
        nw = tl.load(_of_path(path, nq_ptr, nk_ptr, nk_ptr) + c, mask=col_ok, other=0.0).to(tl.float32)
        dn = dm * nw[None, :]
        dm = r * (dn - n * (tl.sum(dn * n, axis=1) / DH)[:, None])
    du = dm * (s + y * (1.0 - s))
    du_owned = tl.where(owned, du, 0.0)
    slots = blocks * (tl.num_programs(1) // H)  # (row block, sequence) pairs
    dx = tl.zeros((BT, BD), dtype=tl.float32)
    for j in tl.static_range(TAPS):
        x = _rows_of(x_ptr, sx0, sx1, sx2, i_b, rows - (TAPS - 1 - j), cols, col_ok, T)
        d_tap = tl.sum(du_owned * x, axis=0)
        tl.store(dw_ptr + (cols * TAPS + j) * slots + i_t * (slots // blocks) + i_b, d_tap, mask=col_ok)
        dx += _rows_ahead(du, TAPS - 1 - j, BT, BD) * _tap_weight(w_ptr, w_cols, col_ok, j, TAPS)[None, :]
    owned_end = tl.minimum(T, i_t * OWN + OWN)
    _store_rows(dx_ptr, T * D, D, 1, i_b, rows, cols, col_ok, owned_end, dx)


_KEY = ["DH", "DVH", "TAPS"]
_KERNELS = {"forward": _fwd_kernel, "backward": _bwd_kernel}


@functools.cache
def _autotuned(kernel_name: str) -> triton.runtime.KernelInterface:
    """A kernel autotuned on CUDA: the forward over (row tile, warps), the backward over warps."""
    if kernel_name == "forward":
        configs = [triton.Config({"BT": bt}, num_warps=w) for bt in (16, 32, 64) for w in (2, 4)]
    else:
        configs = [triton.Config({"BT": _BWD_ROWS}, num_warps=w) for w in (1, 2, 4, 8)]
    return triton.autotune(configs=configs, key=_KEY)(_KERNELS[kernel_name])


def _launch(kernel_name: str, rows_per_program: int | None, blocks, B: int, H: int, *args, **meta) -> None:
    """Launch kernel `kernel_name` ("forward" or "backward") over (blocks(BT) row blocks, B * H, the three paths):
    the interpreter with a fixed tile, CUDA autotuned."""
    if INTERPRET:
        bt = rows_per_program or _INTERP_ROWS
        _KERNELS[kernel_name][(blocks(bt), B * H, 3)](*args, BT=bt, **meta)
    else:
        _autotuned(kernel_name)[lambda m: (blocks(m["BT"]), B * H, 3)](*args, **meta)


def _operands(x, wq, wk, wv, nq, nk, cos, sin, heads: int) -> tuple[tuple[torch.Tensor, ...], dict]:
    """The kernels' weight operands (conv weights [D, TAPS], norm weights and rotary tables as contiguous fp32) and
    their constexpr meta-parameters."""
    convs = tuple(w.reshape(w.shape[0], -1).contiguous() for w in (wq, wk, wv))
    rest = tuple(t.float().contiguous() for t in (nq, nk, cos, sin))
    head_dim, v_head_dim = wq.shape[0] // heads, wv.shape[0] // heads
    meta = dict(DH=head_dim, DVH=v_head_dim, BD=triton.next_power_of_2(max(head_dim, v_head_dim)))
    return (*convs, *rest), meta | dict(TAPS=convs[0].shape[-1])


def gla_inputs_fwd(x, wq, wk, wv, nq, nk, cos, sin, heads: int, eps: float) -> tuple[torch.Tensor, ...]:
    """(q, k, v), each [B, T, H, width] in x's dtype."""
    B, T, _ = x.shape
    outs = tuple(torch.empty(B, T, heads, w.shape[0] // heads, dtype=x.dtype, device=x.device) for w in (wq, wk, wv))
    if x.numel():
        weights, meta = _operands(x, wq, wk, wv, nq, nk, cos, sin, heads)
        args = (x, *weights, *outs, *x.stride(), T, heads, wq.shape[0], eps)
        _launch("forward", None, lambda bt: triton.cdiv(T, bt), B, heads, *args, **meta)
    return outs


def gla_inputs_bwd(x, wq, wk, wv, nq, nk, cos, sin, dq, dk, dv, heads: int, eps: float) -> tuple[torch.Tensor, ...]:
    """(dx in x's dtype, the conv weights' gradients [2 DK + DV, TAPS] and the norm weights' [2, DH] in fp32, q's, k's
    and v's rows in turn) for the output gradients."""
    B, T, D = x.shape
    taps = wq.shape[-1]
    blocks = triton.cdiv(T, _BWD_ROWS - (taps - 1))
    dw = torch.empty(D, taps, blocks * B, dtype=torch.float32, device=x.device)
    dnw = torch.empty(2, nq.shape[0], blocks * B * heads, dtype=torch.float32, device=x.device)
    dx = torch.empty(B, T, D, dtype=x.dtype, device=x.device)
    if dx.numel():  # else the empty partials sum to zero gradients
        weights, meta = _operands(x, wq, wk, wv, nq, nk, cos, sin, heads)
        grads = tuple(d.flatten(2) for d in (dq, dk, dv))
        strides = (*x.stride(), *(st for g in grads for st in g.stride()))
        args = (x, *weights, *grads, dx, dw, dnw, *strides, T, heads, wq.shape[0], D, eps)
        _launch("backward", _BWD_ROWS, lambda bt: blocks, B, heads, *args, **meta)
    return dx, dw.sum(-1), dnw.sum(-1)


def supports(x: torch.Tensor, heads: int, widths: tuple[int, int], taps: int) -> bool:
    """Whether the kernels take this input: a 16/32-bit [B, T, 2 DK + DV] on CUDA (or the interpreter) for widths
    (DK, DV), both divisible by heads with q's and k's heads of even width (RoPE), a convolution of at most MAX_TAPS
    taps."""
    key, value = widths
    if x.dim() != 3 or x.dtype not in INPUT_DTYPES or x.shape[-1] != 2 * key + value or not (x.is_cuda or INTERPRET):
        return False
    return not (key % heads or value % heads or (key // heads) % 2) and 1 <= taps <= MAX_TAPS


@torch.library.custom_op("lkat_lens::gla_inputs", mutates_args=())
def _gla_inputs_op(
    x: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    wv: torch.Tensor,
    nq: torch.Tensor,
    nk: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward as a custom op (opaque to torch.compile)."""
    return gla_inputs_fwd(x, wq, wk, wv, nq, nk, cos, sin, heads, eps)


@_gla_inputs_op.register_fake
def _gla_inputs_fake(x, wq, wk, wv, nq, nk, cos, sin, heads, eps):
    return tuple(x.new_empty(*x.shape[:2], heads, w.shape[0] // heads) for w in (wq, wk, wv))


@torch.library.custom_op("lkat_lens::gla_inputs_backward", mutates_args=())
def _gla_inputs_backward_op(
    x: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    wv: torch.Tensor,
    nq: torch.Tensor,
    nk: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    heads: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward as a custom op: (dx, the conv weights' gradients, the norm weights'), see gla_inputs_bwd."""
    return gla_inputs_bwd(x, wq, wk, wv, nq, nk, cos, sin, dq, dk, dv, heads, eps)


@_gla_inputs_backward_op.register_fake
def _gla_inputs_backward_fake(x, wq, wk, wv, nq, nk, cos, sin, dq, dk, dv, heads, eps):
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    d_convs = x.new_empty(x.shape[-1], wq.shape[-1], dtype=torch.float32)
    return dx, d_convs, x.new_empty(2, nq.shape[0], dtype=torch.float32)


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    *tensors, heads, eps = inputs
    ctx.save_for_backward(*tensors)
    ctx.heads, ctx.eps = heads, eps


def _backward(ctx, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> tuple:
    x, wq, wk, wv, nq, nk, cos, sin = ctx.saved_tensors
    dx, d_convs, d_norms = _gla_inputs_backward_op(x, wq, wk, wv, nq, nk, cos, sin, dq, dk, dv, ctx.heads, ctx.eps)
    weights = (wq, wk, wv)
    convs = (
        d.reshape(w.shape).to(w.dtype) for d, w in zip(d_convs.split([len(w) for w in weights]), weights, strict=True)
    )
    norms = (d.to(n.dtype) for d, n in zip(d_norms, (nq, nk), strict=True))
    return dx, *convs, *norms, None, None, None, None


_gla_inputs_op.register_autograd(_backward, setup_context=_setup_context)


def gla_inputs(
    x: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    wv: torch.Tensor,
    nq: torch.Tensor,
    nk: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    heads: int,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Differentiable (q, k, v) [B, T, heads, width] in x's dtype from x [B, T, 2 DK + DV]: conv + SiLU of each path,
    RMSNorm (weights nq, nk) and RoPE (tables cos, sin [T, DK / heads]) of q and k.

    Gradients reach x, the conv weights and the norm weights (not the rotary tables)."""
    key, value, taps = wq.shape[0], wv.shape[0], wq.shape[-1]
    if wk.shape != wq.shape or wv.shape[1:] != wq.shape[1:] or nq.shape != nk.shape:
        raise ValueError("q and k need equal conv and norm weights' shapes, and v the same number of taps")
    head_dim = key // max(heads, 1)
    if cos.shape != (x.shape[1], head_dim) or sin.shape != cos.shape:
        raise ValueError(f"rotary tables must be [T, head dim] = {(x.shape[1], head_dim)}, got {tuple(cos.shape)}")
    if not supports(x, heads, (key, value), taps):
        raise ValueError(
            f"gla_inputs needs a [B, T, 2 DK + DV] = {2 * key + value} wide tensor in {INPUT_DTYPES} on CUDA (or the "
            f"Triton interpreter) with DK and DV divisible by heads ({heads}), q's heads of even width, and 1 to "
            f"{MAX_TAPS} convolution taps; got {tuple(x.shape)} {x.dtype} on {x.device}, {taps} taps"
        )
    return _gla_inputs_op(x, wq, wk, wv, nq, nk, cos, sin, heads, float(eps))
