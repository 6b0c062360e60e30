"""GLA's chunk states and their gradients passed between chunks in parallel, for fla's chunk mode and gla_short.

fla's chunk GLA carries the state S [K, V] from chunk to chunk in a serial walk, one program per (sequence, head,
state tile), forward (`chunk_fwd_kernel_h`) and backward (`chunk_bwd_kernel_dh`). Here the same tensors come from
two parallel steps. With g the chunk-local cumsum of the log gates in log2 units (fla's `g_cumsum`, [B, T, H, K]),
chunks of BT tokens, NT of them, and d_c[k] = 2^(g at chunk c's last token) the decay across chunk c:

- own terms, every chunk at once (`_own_states_kernel`, `_own_state_grads_kernel`):
    forward:  x_0 = 0, x_{c+1} = sum_{t in c} (k_t * 2^(g_last(c) - g_t)) v_t^T      (what chunk c adds)
    backward: x_{NT-1} = 0, x_{c-1} = scale * sum_{t in c} (q_t * 2^(g_t)) do_t^T    (what chunk c asks of S)
- a scan along the chunks (`_scan_kernel`):
    forward:  y_0 = x_0,       y_c = d_{c-1} * y_{c-1} + x_c    (h[c]: the state entering chunk c)
    reverse:  y_{NT-1} = x_{NT-1}, y_c = d_{c+1} * y_{c+1} + x_c    (dh[c]: the gradient of the state after chunk c)
  each decay broadcast over V. The recurrence is associative ((a1, b1) then (a2, b2) is (a1 a2, b1 a2 + b2)), so a
  program scans a block of chunks at once with tl.associative_scan and carries its last state into the next block.

h and dh are laid out as fla's ([B, NT, H, K, V]) and feed its other chunk kernels (`kernels.gla_fla`). fla 0.6.0
has the own-term step too (`chunk_h_parallel`), but in natural log units, which would need a second cumsum of the
gates, and it sums the terms in another serial walk. The same steps give `kernels.gla_short` the state entering each
of its segments and the gradient of the state after it (`states_from_gates`, `state_grads_from_gates`): there a
chunk is a segment (128 tokens), the own-term kernels take the log gates themselves and sum them along the chunk in
blocks of 64 tokens (the cumsum never written out), and hand the scan each chunk's total. Their products take the
operands' dtype (bf16 in LKAT), fp32 operands exactly (IEEE, as the short kernels do).

Why: at 2048^2 an LKAT-S batch is two sequences of 16,389 tokens, 257 chunks of 64. fla's walks there ran 48
programs stepping 257 times: 11.5 ms of a 53 ms training step on an H200. Here the own terms take 45-55 us a call and
the scan 52-67 us (H100; bandwidth alone would allow about 45 and 30): chunk mode's forward + backward of one layer
went 2.25 -> 1.67 ms at that shape on an H100 (`bench_gla.py --states-lengths`), and less than fla's walks wherever
T is over ~3,000 tokens at LKAT-S's tokens per batch. On CUDA the kernels are autotuned; with TRITON_INTERPRET=1 in
the environment before triton is first imported they run on CPU tensors with fixed tiles.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from .dtypes import compute_dtype
from .host_math import cdiv
from .tuned import TunedKernel, kernel_table

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
_INTERP_TILE = {"BE": 64, "BC": 4}  # small blocks under the interpreter, so the tests cross several of them
_INTERP_STATE_TILE = {"BK": 16, "BV": 16}
_TOKEN_BLOCK = 64  # the kernels walk a chunk in blocks of at most this many tokens
RCP_LN2: tl.constexpr = tl.constexpr(1 / math.log(2))
# Triton 3.8's interpreter gets tl.dot of 16-bit operands wrong (values ~1e10), so there the own terms' products
# take fp32 operands; compiled kernels multiply in the operands' dtype.
_DOT_IN_FP32: tl.constexpr = tl.constexpr(INTERPRET)


def _last_tokens(T: int, chunk_size: int, device: torch.device) -> torch.Tensor:
    """Index of each chunk's last token."""
    return (torch.arange(1, cdiv(T, chunk_size) + 1, device=device) * chunk_size).clamp(max=T) - 1


def own_states_reference(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """The forward own terms x of the module docstring, [B, NT, H, K, V] in fp32 (fp64 for fp64 inputs)."""
    dtype = compute_dtype(k)
    B, T, H, K = k.shape
    NT = cdiv(T, chunk_size)
    x = k.new_zeros(B, NT, H, K, v.shape[-1], dtype=dtype)
    g_last = g[:, _last_tokens(T, chunk_size, k.device)].to(dtype)
    for c in range(NT - 1):
        rows = slice(c * chunk_size, (c + 1) * chunk_size)
        kd = k[:, rows].to(dtype) * torch.exp2(g_last[:, c : c + 1] - g[:, rows].to(dtype))
        x[:, c + 1] = torch.einsum("bthk,bthv->bhkv", kd, v[:, rows].to(dtype))
    return x


def own_state_grads_reference(
    q: torch.Tensor, do: torch.Tensor, g: torch.Tensor, scale: float, chunk_size: int
) -> torch.Tensor:
    """The backward own terms x of the module docstring, [B, NT, H, K, V] in fp32 (fp64 for fp64 inputs)."""
    dtype = compute_dtype(q)
    B, T, H, K = q.shape
    NT = cdiv(T, chunk_size)
    x = q.new_zeros(B, NT, H, K, do.shape[-1], dtype=dtype)
    for c in range(1, NT):
        rows = slice(c * chunk_size, (c + 1) * chunk_size)
        qd = q[:, rows].to(dtype) * torch.exp2(g[:, rows].to(dtype)) * scale
        x[:, c - 1] = torch.einsum("bthk,bthv->bhkv", qd, do[:, rows].to(dtype))
    return x


def scan_reference(x: torch.Tensor, g: torch.Tensor, chunk_size: int, reverse: bool = False) -> torch.Tensor:
    """The scan y of the module docstring, one chunk at a time, in x's dtype (fp32 compute, fp64 for fp64 x)."""
    dtype = compute_dtype(x)
    NT = x.shape[1]
    decay = torch.exp2(g[:, _last_tokens(g.shape[1], chunk_size, x.device)].to(dtype)).unsqueeze(-1)
    y = torch.empty_like(x, dtype=dtype)
    prev = None
    for c in range(NT - 1, -1, -1) if reverse else range(NT):
        y[:, c] = x[:, c].to(dtype) if prev is None else decay[:, prev] * y[:, prev] + x[:, c].to(dtype)
        prev = c
    return y.to(x.dtype)


@triton.jit
def _chunk_tile(ptr, i_b, i_h, o_t, m_t, o_d, T, H: tl.constexpr, D: tl.constexpr):
    """[BD, BT] tile (channels o_d, tokens o_t) of a [B, T, H, D] tensor, zero where masked."""
    p = ptr + ((i_b * T + o_t).to(tl.int64) * H + i_h)[None, :] * D + o_d[:, None]
    return tl.load(p, mask=m_t[None, :] & (o_d < D)[:, None], other=0.0)


@triton.jit
def _own_term_program(H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """This program's chunk, sequence, head and state tile (K and V offsets, mask)."""
    i_kv, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_k, i_v = i_kv // tl.cdiv(V, BV), i_kv % tl.cdiv(V, BV)
    o_k, o_v = i_k * BK + tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    return i_c, i_bh // H, i_bh % H, o_k, o_v, m_kv


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr):
    """a @ b with fp32 accumulation at PRECISION for fp32 operands (fp32 operands under the interpreter, see
    _DOT_IN_FP32)."""
    if _DOT_IN_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _store_state(x, value, i_b, c, i_h, o_k, o_v, m_kv, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """x[i_b, c, i_h] = value on one (K, V) tile of a [B, NT, H, K, V] tensor."""
    o_x = ((i_b * NT + c).to(tl.int64) * H + i_h) * (K * V) + o_k[:, None] * V + o_v[None, :]
    tl.store(x + o_x, value, mask=m_kv)


@triton.jit
def _store_totals(gl, total, i_b, c, i_h, o_k, NT, H: tl.constexpr, K: tl.constexpr, BV: tl.constexpr, V: tl.constexpr):
    """gl[i_b, c, i_h, o_k] = total * log2(e) (a chunk's gate sum in log2 units) from the first V tile's programs."""
    if tl.program_id(0) % tl.cdiv(V, BV) == 0:
        tl.store(gl + ((i_b * NT + c).to(tl.int64) * H + i_h) * K + o_k, total * RCP_LN2, mask=o_k < K)


@triton.jit
def _own_states_kernel(k, v, g, x, gl, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                       BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr, PRECISION: tl.constexpr,
                       RAW: tl.constexpr):  # fmt: skip
    """x[c + 1] of chunk c (x[0] = 0 from chunk 0's programs) for one (K, V) tile of one (sequence, head), summed
    over the chunk's blocks of BS tokens. RAW: g holds the log gates themselves (natural units); the blocks are
    taken last first, the decay to the chunk's end summed on the way, and the chunk's gate sum goes to gl."""
    i_c, i_b, i_h, o_k, o_v, m_kv = _own_term_program(H, K, V, BK, BV)
    if i_c == 0:
        _store_state(x, tl.zeros([BK, BV], dtype=tl.float32), i_b, 0, i_h, o_k, o_v, m_kv, NT, H, K, V)
    if i_c < NT - 1:
        if not RAW:
            last = tl.minimum((i_c + 1) * BT, T) - 1
            g_last = tl.load(g + ((i_b * T + last).to(tl.int64) * H + i_h) * K + o_k, mask=o_k < K, other=0.0)
        acc = tl.zeros([BK, BV], dtype=tl.float32)
        later = tl.zeros([BK], dtype=tl.float32)  # RAW: the gate sum over the chunk's rows after this block
        for j in tl.static_range(BT // BS):
            o_t = i_c * BT + ((BT // BS - 1 - j) if RAW else j) * BS + tl.arange(0, BS)
            m_t = o_t < T
            b_g = _chunk_tile(g, i_b, i_h, o_t, m_t, o_k, T, H, K).to(tl.float32)
            if RAW:
                decay = tl.exp(tl.cumsum(b_g, axis=1, reverse=True) - b_g + later[:, None])
                later += tl.sum(b_g, axis=1)
            else:
                decay = tl.exp2(g_last[:, None] - b_g)
            b_k = _chunk_tile(k, i_b, i_h, o_t, m_t, o_k, T, H, K)
            b_k = tl.where(m_t[None, :], b_k * decay, 0.0).to(k.dtype.element_ty)
            acc += _dot(b_k, tl.trans(_chunk_tile(v, i_b, i_h, o_t, m_t, o_v, T, H, V)), PRECISION)
        _store_state(x, acc, i_b, i_c + 1, i_h, o_k, o_v, m_kv, NT, H, K, V)
        if RAW:
            _store_totals(gl, later, i_b, i_c, i_h, o_k, NT, H, K, BV, V)


@triton.jit
def _own_state_grads_kernel(q, do, g, x, gl, scale, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                            BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
                            PRECISION: tl.constexpr, RAW: tl.constexpr):  # fmt: skip
    """x[c - 1] of chunk c (x[NT - 1] = 0 from the last chunk's programs) for one (K, V) tile. RAW: g holds the log
    gates themselves; their cumsum from the chunk's start is taken on the way, and the chunk's gate sum goes to gl."""
    i_c, i_b, i_h, o_k, o_v, m_kv = _own_term_program(H, K, V, BK, BV)
    if i_c == NT - 1:
        _store_state(x, tl.zeros([BK, BV], dtype=tl.float32), i_b, NT - 1, i_h, o_k, o_v, m_kv, NT, H, K, V)
    if i_c > 0:
        acc = tl.zeros([BK, BV], dtype=tl.float32)
        earlier = tl.zeros([BK], dtype=tl.float32)  # RAW: the gate sum over the chunk's rows before this block
        for j in tl.static_range(BT // BS):
            o_t = i_c * BT + j * BS + tl.arange(0, BS)
            m_t = o_t < T
            b_g = _chunk_tile(g, i_b, i_h, o_t, m_t, o_k, T, H, K).to(tl.float32)
            if RAW:
                decay = tl.exp(tl.cumsum(b_g, axis=1) + earlier[:, None])
                earlier += tl.sum(b_g, axis=1)
            else:
                decay = tl.exp2(b_g)
            b_q = _chunk_tile(q, i_b, i_h, o_t, m_t, o_k, T, H, K)
            # in fp32: torch.compile passes a Python float as fp64 (tuned.py)
            b_q = tl.where(m_t[None, :], b_q * decay * tl.cast(scale, tl.float32), 0.0).to(q.dtype.element_ty)
            acc += _dot(b_q, tl.trans(_chunk_tile(do, i_b, i_h, o_t, m_t, o_v, T, H, V)), PRECISION)
        _store_state(x, acc, i_b, i_c - 1, i_h, o_k, o_v, m_kv, NT, H, K, V)
        if RAW:
            _store_totals(gl, earlier, i_b, i_c, i_h, o_k, NT, H, K, BV, V)


@triton.jit
def _linear_step(a1, b1, a2, b2):
    """Two steps y -> a y + b, the first then the second, as one."""
    return a1 * a2, b1 * a2 + b2


@triton.jit
def _scan_rows(start, i_b, i_h, o_e, m_e, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BC: tl.constexpr,
               REVERSE: tl.constexpr):  # fmt: skip
    """(scan positions i, the chunks n whose decay carries the state into theirs, mask of i, offsets of their
    [BC, BE] tiles in x and y, the tiles' mask) of the BC positions from `start`. Apart from _scan_block,
    which loads through them: Triton's mutation analysis, as torch.compile runs it, counts every pointer a called
    function takes as a source of what it returns, so offsets returned beside loads from x and g would make the
    store through them count x and g as written (and torch.compile copy them first)."""
    i = start + tl.arange(0, BC)  # scan position
    c = NT - 1 - i if REVERSE else i  # its chunk
    n = c + 1 if REVERSE else c - 1  # the chunk whose decay carries its state into chunk c
    m_c = i < NT
    o_x = ((i_b * NT + c).to(tl.int64) * H + i_h)[:, None] * (K * V) + o_e[None, :]
    return i, n, m_c, o_x, m_c[:, None] & m_e[None, :]


@triton.jit
def _scan_block(x, g, start, i_b, i_h, o_e, o_k, m_e, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BT: tl.constexpr, BC: tl.constexpr, REVERSE: tl.constexpr, TOTALS: tl.constexpr):  # fmt: skip
    """(decays a, terms b) of the BC scan positions from `start`: [BC, BE] tiles. The decay of chunk n is 2^(g at its
    last token), or 2^g[n] with TOTALS (g: [B, NT, H, K], each chunk's log2 gate sum)."""
    i, n, m_c, o_x, m_x = _scan_rows(start, i_b, i_h, o_e, m_e, NT, H, K, V, BC, REVERSE)
    if TOTALS:
        p_g = g + ((i_b * NT + n).to(tl.int64) * H + i_h)[:, None] * K + o_k[None, :]
    else:
        last = (tl.minimum((n + 1) * BT, T) - 1).to(tl.int64)
        p_g = g + ((i_b * T + last) * H + i_h)[:, None] * K + o_k[None, :]
    a = tl.exp2(tl.load(p_g, mask=(m_c & (i > 0))[:, None] & m_e[None, :], other=float("-inf")))
    return a, tl.load(x + o_x, mask=m_x, other=0.0).to(tl.float32)


@triton.jit
def _scan_kernel(x, g, y, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                 BE: tl.constexpr, BC: tl.constexpr, REVERSE: tl.constexpr, TOTALS: tl.constexpr):  # fmt: skip
    """y for BE state elements (k, v flattened) of one (sequence, head), through all NT chunks in blocks of BC; each
    block's loads are issued before the previous block is scanned (their latency hidden behind its work)."""
    i_e, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_e = i_e * BE + tl.arange(0, BE)
    m_e = o_e < K * V
    o_k = o_e // V
    carry = tl.zeros([BE], dtype=tl.float32)
    a, b = _scan_block(x, g, 0, i_b, i_h, o_e, o_k, m_e, T, NT, H, K, V, BT, BC, REVERSE, TOTALS)
    o_x, m_x = _scan_rows(0, i_b, i_h, o_e, m_e, NT, H, K, V, BC, REVERSE)[3:]
    for start in range(BC, NT + BC, BC):
        a_next, b_next = _scan_block(x, g, start, i_b, i_h, o_e, o_k, m_e, T, NT, H, K, V, BT, BC, REVERSE, TOTALS)
        a_cum, b_cum = tl.associative_scan((a, b), 0, _linear_step)
        out = a_cum * carry[None, :] + b_cum
        tl.store(y + o_x, out.to(y.dtype.element_ty), mask=m_x)
        carry = tl.sum(tl.where((tl.arange(0, BC) == BC - 1)[:, None], out, 0.0), axis=0)
        a, b = a_next, b_next
        o_x, m_x = _scan_rows(start, i_b, i_h, o_e, m_e, NT, H, K, V, BC, REVERSE)[3:]


# Autotuned: (element tile, chunk block, warps) for the scan, keyed on NT too (its best tile follows the program
# count); (K tile, V tile, warps) for the own terms. A scan tile of 128 elements a warp (4 a lane) keeps each
# column's chunks in one thread, a scan without shuffles. With the next block's tiles held beside the current ones,
# 4 lanes' columns x 16 chunks spill on sm_90 ((128, 16, 1) and (256, 16, 2): 255 registers, 364-412 bytes of spill
# stores; benchmarks/kernel_registers.py), and neither won any autotuning at 16 chunks or more on the H100 or H200,
# so they are left out; the H100 and H200 chose (64, 16, 1) or (128, 8, 1) at 65 and 257 chunks.
_SCAN_CONFIGS = ((32, 32, 1), (64, 16, 1), (64, 32, 2), (128, 8, 1))
_STATE_CONFIGS = ((32, 32, 2), (32, 64, 4), (64, 64, 4), (64, 64, 8))
_OWN_KERNELS = {"states": _own_states_kernel, "grads": _own_state_grads_kernel}


@kernel_table(("scan", *_OWN_KERNELS))
def _autotuned(name: str) -> TunedKernel:
    """The CUDA kernel `name` ("scan", "states", "grads") autotuned over its configs."""
    if name == "scan":
        configs = [triton.Config({"BE": be, "BC": bc}, num_warps=w) for be, bc, w in _SCAN_CONFIGS]
        return TunedKernel(triton.autotune(configs, key=["K", "V", "BT", "REVERSE", "NT"])(_scan_kernel))
    configs = [triton.Config({"BK": bk, "BV": bv}, num_warps=w) for bk, bv, w in _STATE_CONFIGS]
    return TunedKernel(triton.autotune(configs, key=["K", "V", "BT"])(_OWN_KERNELS[name]))


def scan(x: torch.Tensor, g: torch.Tensor, chunk_size: int, reverse: bool = False, out_dtype=None) -> torch.Tensor:
    """y of the module docstring for x [B, NT, H, K, V] and g [B, T, H, K] (contiguous, on CUDA or under the
    interpreter), a new tensor in out_dtype (x's by default; never in place: the autotuner runs the kernel again)."""
    B, NT, H, K, V = x.shape
    T = g.shape[1]
    if g.shape != (B, T, H, K) or NT != cdiv(T, chunk_size):
        raise ValueError(f"chunk states {tuple(x.shape)} do not fit gates {tuple(g.shape)} in chunks of {chunk_size}")
    return _scan(x, g, T, chunk_size, reverse, out_dtype, totals=False)


def _scan(x, g, T: int, chunk_size: int, reverse: bool, out_dtype, totals: bool) -> torch.Tensor:
    """The scan's launch; g is the log2 gate cumsum [B, T, H, K], or with `totals` each chunk's sum [B, NT, H, K]."""
    B, NT, H, K, V = x.shape
    y = torch.empty_like(x, dtype=out_dtype or x.dtype)
    args = (x, g, y, T, NT, H, K, V, chunk_size)
    grid = lambda m: (cdiv(K * V, m["BE"]), B * H)  # noqa: E731
    if INTERPRET:
        _scan_kernel[grid(_INTERP_TILE)](*args, **_INTERP_TILE, REVERSE=reverse, TOTALS=totals)
    else:
        _autotuned("scan")[grid](*args, REVERSE=reverse, TOTALS=totals)
    return y


def _own_terms(
    name: str, a: torch.Tensor, b: torch.Tensor, g: torch.Tensor, chunk_size: int, *scale, raw: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, totals): the own terms [B, NT, H, K, V] (fp32) of kernel `name` from a [B, T, H, K] and b [B, T, H, V],
    and with `raw` gates (natural units, not a cumsum) each chunk's log2 gate sum [B, NT, H, K] (else empty)."""
    if a.shape != g.shape or b.shape[:3] != g.shape[:3] or not is_chunk_size(chunk_size):
        raise ValueError(f"{tuple(a.shape)}, {tuple(b.shape)} and gates {tuple(g.shape)} do not fit chunks of "
                         f"{chunk_size} (tl.dot needs a power of two, 16 or more)")  # fmt: skip
    B, T, H, K, V = *a.shape, b.shape[-1]
    NT = cdiv(T, chunk_size)
    x = a.new_empty(B, NT, H, K, V, dtype=torch.float)
    totals = a.new_empty((B, NT, H, K) if raw else (0,), dtype=torch.float)
    args = (a, b, g, x, totals, *scale, T, NT, H, K, V, chunk_size)
    grid = lambda m: (cdiv(K, m["BK"]) * cdiv(V, m["BV"]), NT, B * H)  # noqa: E731
    # exact products of fp32 operands (as gla_short's walks take them), TF32 would cost fp32 inputs ~5e-4
    precision = "ieee" if a.dtype == b.dtype == torch.float32 else "tf32"
    meta = dict(BS=min(chunk_size, _TOKEN_BLOCK), PRECISION=precision, RAW=raw)
    if INTERPRET:
        _OWN_KERNELS[name][grid(_INTERP_STATE_TILE)](*args, **_INTERP_STATE_TILE, **meta)
    else:
        _autotuned(name)[grid](*args, **meta)
    return x, totals


def is_chunk_size(chunk_size: int) -> bool:
    """Whether the kernels take chunks of chunk_size tokens: a power of two, 16 or more (tl.dot's smallest tile)."""
    return chunk_size >= 16 and chunk_size & (chunk_size - 1) == 0


def states(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, chunk_size: int, dtype=None) -> torch.Tensor:
    """h [B, NT, H, K, V]: the state entering each chunk, in dtype (fp32 by default), from g the chunk-local log2
    gate cumsum (fla's g_cumsum)."""
    return scan(_own_terms("states", k, v, g, chunk_size)[0], g, chunk_size, out_dtype=dtype)


def state_grads(q: torch.Tensor, do: torch.Tensor, g: torch.Tensor, scale: float, chunk_size: int) -> torch.Tensor:
    """dh [B, NT, H, K, V] in fp32: the gradient of the state after each chunk (fla's chunk_bwd_dh)."""
    return scan(_own_terms("grads", q, do, g, chunk_size, scale)[0], g, chunk_size, reverse=True)


def states_from_gates(k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """`states` (fp32) from the log gates gk themselves [B, T, H, K] (natural units): the own-term kernel sums them
    along each chunk and hands the scan each chunk's total, so no cumsum of the gates is written."""
    x, totals = _own_terms("states", k, v, gk.contiguous(), chunk_size, raw=True)
    return _scan(x, totals, gk.shape[1], chunk_size, False, None, totals=True)


def state_grads_from_gates(q: torch.Tensor, do: torch.Tensor, gk: torch.Tensor, scale: float, chunk_size: int):
    """`state_grads` from the log gates gk themselves, as `states_from_gates`."""
    x, totals = _own_terms("grads", q, do, gk.contiguous(), chunk_size, scale, raw=True)
    return _scan(x, totals, gk.shape[1], chunk_size, True, None, totals=True)
