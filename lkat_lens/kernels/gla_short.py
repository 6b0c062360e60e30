"""Gated Linear Attention on chip: one Triton program per (batch, head, segment) keeps the state in registers.

Layout is fla's: q, k, gk [B, T, H, K], v [B, T, H, V], gk the log forget gate (<= 0), any strides.
o_t = scale * S_t^T q_t with S_t = diag(exp(gk_t)) S_{t-1} + k_t v_t^T (see `kernels.gla`).

The forward is two kernels over chunks of CHUNK = 16 rows. With b the gate cumsum from the chunk start:
    o_t = sum_{s <= t in the chunk} A[t, s] v_s + (q_t * exp(b_t))^T S,   A[t, s] = sum_k q_t k_s exp(b_t - b_s),
    S  <- diag(exp(b_last)) S + sum_s (k_s * exp(b_last - b_s)) v_s^T   (the state before the chunk).
The first, one program per (batch, head, chunk), writes the intra-chunk part A @ v to an fp32 accumulator (o
itself when o is fp32). The second walks the chunks of one (batch, head, V tile) with the [K, V] state in registers
and writes o = accumulator + inter-chunk part, so a 16-bit o is rounded once. Taking the intra-chunk work out of the
serial walk made the forward 0.86x / 0.82x / 0.83x as long at 3 / 6 / 12 heads of 64 (H100, bf16, batch 128,
T 201; the probe is recorded in benchmarks/README.md).
Within a chunk the decays factor directly, A = (q * exp(b)) (k * exp(-b))^T masked to s <= t, one tl.dot, while
|b| <= SAFE_LOG (exp(+-40) leaves q and k scaled far inside fp32's and TF32's range; LKAT's gates, logsigmoid / 16,
keep b within a few units). Chunks whose gates decay faster go by binary levels instead, safe for any gates: a pair
s < t of chunk rows belongs to the level W (8, 4, 2, 1) of the highest bit in which their row numbers differ, so s
lies in the early half and t in the late half of one block of 2W rows. With r the block's first late row,
exp(b_t - b_s) = exp(b_t - b_r) * exp(b_r - b_s) and s < r <= t: both factors are <= 1, nothing can overflow, and
each level is one tl.dot, the diagonal (decay 1) a row-wise sum. Both are exact up to the dots' rounding. Every
tl.dot takes fp32 operands with fp32 accumulation: TF32 for 16-bit inputs, exact products when q, k and v are all
fp32. One exception: do . v^T in the backward, whose operands are bf16 inputs as they come, multiplies them as bf16
(the same exact products, on the 16-bit tensor cores). Rounding the other operands to bf16 instead (fla's
way) made the kernels faster but less exact than fla's chunk_gla (benchmarks/README.md, "bf16 tensor-core operands").

The backward is one program per (batch, head, segment). A forward walk recomputes the states, writes the
inter-chunk part of dq into the fp32 gate-gradient buffer and finds the segment's largest |b|; a reverse walk
carries dS (the gradient of the state) in registers, adds the intra-chunk parts of dq and dk, and forms the gate
gradient from the identity dL/dG_t = q_t * dq_t - k_t * dk_t (G = cumsum of gk), so dgk is its reverse cumsum
over t. The reverse walk is written twice, direct and by levels, and a segment takes one or the other whole.
Backward ms at 3 / 6 / 12 heads of 64 (H100, bf16, batch 128, T 201, graph replays, two runs each): levels only
0.362-0.374 / 0.569-0.576 / 1.110-1.126, now 0.247 / 0.471-0.472 / 0.924-0.944; the choice made chunk by chunk inside
one walk (both in its registers) 0.306 / 0.492 / 0.963; a kernel with no level walk at all (wrong for fast gates)
0.233 / 0.428 / 0.847.
Only q, k, v and gk are saved for the backward (and h, when walked in segments). Split like the forward (an intra-chunk
kernel writing fp32 parts, then the walks adding the rest) it was slower at 6 and 12 heads: 0.62 / 1.21 against 0.57 /
1.12 ms (0.32 against 0.37 at 3 heads), since the walks themselves are most of it and the fp32 parts add memory traffic.

Long sequences (T >= SEGMENTS_MIN_T) are walked in segments of SEGMENT tokens, one program each, so that a batch of a
few long sequences still fills the GPU: at 1024^2 an LKAT-S batch is 6 sequences of 4,097 tokens, 36 programs for one
walk each. The state entering each segment, h [B, NS, H, K, V] in fp32, comes first from
`chunk_states.states_from_gates` (each segment's own term, then a scan along the segments) and starts the segment's
forward walk; it is kept for the backward, where `chunk_states.state_grads_from_gates` gives the gradient of the state
after each segment, dh, which starts the reverse walk. Both walks then see exactly what one walk over the sequence
would: the gate gradient's share from past the segment, sum over the later rows of q * dq - k * dk, is dL/dgk at the
next segment's first row, sum_v S * dS of the state S after the segment (the forward walk's last) and dh. Forward +
backward ms of one layer against fla's chunk_gla (parallel state passing) at LKAT-S's heads, tokens per batch held at
128 x 201 (H200, graph replays, `bench_gla.py --lengths ... --segments 0 64 128 256`): at 16,389 / 4,101 / 1,029 / 513
tokens one walk took 7.73 / 2.63 / 1.02 / 0.83x chunk's time, segments of 64 0.76 / 0.77 / 0.84 / 0.85x, of 128 0.70 /
0.77 / 0.81 / 0.81x, of 256 0.68 / 0.84 / 0.88 / 0.90x; at 201 tokens one walk 0.59x, segments of 128 0.80x. Longer
walks also sum dgk's reverse cumsum over more rows (at 4,097 tokens one walk, 256 and 512 gave dgk Frobenius errors of
5.8e-3, 2.3e-3 and 2.7e-3 against chunk_gla's 2.2e-3, 128 less than it), so SEGMENT is 128.

On CUDA the kernels are autotuned; with TRITON_INTERPRET=1 in the environment before triton is first
imported they run on CPU tensors through the Triton interpreter with a fixed configuration. The op is a
torch custom op, so torch.compile keeps it in the graph as one opaque call.
"""

import os

import torch
import triton
import triton.language as tl

from . import chunk_states
from .autograd_ops import Kernel, differentiable
from .host_math import cdiv
from .tuned import TunedKernel, kernel_table, programs_key

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
CHUNK: tl.constexpr = tl.constexpr(16)
LEVELS: tl.constexpr = tl.constexpr(4)  # log2(CHUNK)
# Largest |gate cumsum| within a chunk for which the intra-chunk decays are factored as exp(b) * exp(-b)
SAFE_LOG: tl.constexpr = tl.constexpr(40.0)
HEAD_DIMS = (16, 32, 64, 128)
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Interpreter launch: V tiles of at most this width, so that the V-tiled grid runs.
_INTERP_BLOCK_V = 32
# Sequences of SEGMENTS_MIN_T tokens or more are walked in segments of SEGMENT tokens (module docstring): at 513
# tokens one walk and segments of 128 were even (0.83 / 0.81x chunk's time), from 1,029 on the segments won.
SEGMENT = 128
SEGMENTS_MIN_T = 512


@triton.jit
def _mm(a, b, PRECISION: tl.constexpr):
    """a @ b with fp32 accumulation: of bf16 operands (PRECISION "bf16"), else of fp32 operands at PRECISION ("tf32"
    or "ieee")."""
    if PRECISION == "bf16":
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)


@triton.jit
def _tile(ptr, strides, i_b, i_h, rows, cols, T):
    """Rows `rows` (zero past T) of head (i_b, i_h)'s [T, D] matrix in a [B, T, H, D] tensor, as fp32."""
    offs = rows[:, None] * strides[1] + cols[None, :] * strides[3]
    return tl.load(ptr + i_b * strides[0] + i_h * strides[2] + offs, mask=(rows < T)[:, None], other=0.0).to(tl.float32)


@triton.jit
def _store_tile(ptr, strides, i_b, i_h, x, rows, cols, T):
    """Write x into rows `rows` (those before T) of head (i_b, i_h)'s [T, D] matrix, in the tensor's dtype."""
    offs = rows[:, None] * strides[1] + cols[None, :] * strides[3]
    tl.store(ptr + i_b * strides[0] + i_h * strides[2] + offs, x.to(ptr.dtype.element_ty), mask=(rows < T)[:, None])


@triton.jit
def _gates(g_ptr, strides, i_b, i_h, rows, cols, T):
    """(b, b_last) of a chunk: the log-gate cumsum from the chunk start [CHUNK, K] and its total [K]."""
    g = _tile(g_ptr, strides, i_b, i_h, rows, cols, T)
    return tl.cumsum(g, axis=0), tl.sum(g, axis=0)


@triton.jit
def _carry(state, k, v, b, b_last, PRECISION: tl.constexpr):
    """The state after a chunk: S <- diag(exp(b_last)) S + sum_s (k_s * exp(b_last - b_s)) v_s^T."""
    k_to_end = k * tl.exp(b_last[None, :] - b)
    return state * tl.exp(b_last)[:, None] + _mm(tl.trans(k_to_end), v, PRECISION)


@triton.jit
def _level(q, k, b, rt, W: tl.constexpr, PRECISION: tl.constexpr):
    """The chunk level with half-width W: pairs s < t whose rows first differ in bit W.

    Rows form blocks of 2W, each an early and a late half; the reference r is the first late row. Returns
    (scores, q_f, k_f, f, late, same): the level's share of A[t, s]; q_f = q * f on late rows and k_f = k * f on
    early rows (0 elsewhere), with f = exp(b_t - b_r) on late rows, exp(b_r - b_s) on early rows (both <= 1);
    `late` [CHUNK, 1], and `same` [CHUNK, CHUNK] marking (t, s) in one block.
    """
    ref_row = (rt // (2 * W)) * (2 * W) + W
    ref = tl.gather(b, tl.broadcast_to(ref_row[:, None], b.shape), axis=0)  # b at each row's reference row
    late = ((rt // W) % 2 == 1)[:, None]
    f = tl.exp(tl.where(late, b - ref, ref - b))
    same = (rt[:, None] // (2 * W)) == (rt[None, :] // (2 * W))
    q_f, k_f = tl.where(late, q * f, 0.0), tl.where(late, 0.0, k * f)
    return tl.where(same, _mm(q_f, tl.trans(k_f), PRECISION), 0.0), q_f, k_f, f, late, same


@triton.jit
def _span(b):
    """The largest |b| of a chunk's gate cumsum b [CHUNK, K], per column [K]."""
    return tl.max(tl.abs(b), axis=0)


@triton.jit
def _direct_factors(q, k, b):
    """(q * exp(b), k * exp(-b)): the operands of the direct intra-chunk scores (needs |b| <= SAFE_LOG)."""
    return q * tl.exp(b), k * tl.exp(-b)


@triton.jit
def _level_scores(q, k, b, rt, PRECISION: tl.constexpr):
    """A[t, s] of one chunk, 0 above the diagonal: the row-wise diagonal plus the LEVELS levels."""
    scores = tl.where(rt[:, None] == rt[None, :], tl.sum(q * k, axis=1)[:, None], 0.0)
    for lv in tl.static_range(LEVELS):
        scores += _level(q, k, b, rt, CHUNK >> (lv + 1), PRECISION)[0]
    return scores


@triton.jit
def _gla_short_fwd_intra_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, oa_ptr, sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d, sg_b,
    sg_t, sg_h, sg_d, so_b, so_t, so_h, so_d, T, H, scale, programs,
    K: tl.constexpr, V: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """The intra-chunk output A @ v of one (batch * head, chunk) into the fp32 accumulator oa (o's strides so),
    which _gla_short_fwd_kernel reads; `programs` is only the autotuning key."""
    sq, sk, sv, sg, so = (
        (sq_b, sq_t, sq_h, sq_d),
        (sk_b, sk_t, sk_h, sk_d),
        (sv_b, sv_t, sv_h, sv_d),
        (sg_b, sg_t, sg_h, sg_d),
        (so_b, so_t, so_h, so_d),
    )
    # in fp32: torch.compile passes a Python float as fp64 (tuned.py)
    scale = tl.cast(scale, tl.float32)
    i_bh, i_c = tl.program_id(0), tl.program_id(1)
    i_b, i_h = (i_bh // H).to(tl.int64), (i_bh % H).to(tl.int64)
    rt = tl.arange(0, CHUNK)
    ck = tl.arange(0, K)
    cv = tl.arange(0, V)
    rows = i_c * CHUNK + rt
    q = _tile(q_ptr, sq, i_b, i_h, rows, ck, T) * scale
    k = _tile(k_ptr, sk, i_b, i_h, rows, ck, T)
    v = _tile(v_ptr, sv, i_b, i_h, rows, cv, T)
    b = _gates(g_ptr, sg, i_b, i_h, rows, ck, T)[0]
    if tl.max(_span(b), axis=0) <= SAFE_LOG:
        q_up, k_down = _direct_factors(q, k, b)
        scores = tl.where(rt[:, None] >= rt[None, :], _mm(q_up, tl.trans(k_down), PRECISION), 0.0)
    else:
        scores = _level_scores(q, k, b, rt, PRECISION)
    _store_tile(oa_ptr, so, i_b, i_h, _mm(scores, v, PRECISION), rows, cv, T)


@triton.jit
def _segment(T, seg_len):
    """This program's segment: (index, first row, end row); program axis 1 counts the segments of seg_len rows."""
    i_s = tl.program_id(1)
    return i_s, i_s * seg_len, tl.minimum(i_s * seg_len + seg_len, T)


@triton.jit
def _segment_state(ptr, i_b, i_s, i_h, T, seg_len, H, ck, cv, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                   SEGMENTED: tl.constexpr):  # fmt: skip
    """Columns cv (BV of them) of segment i_s's [K, V] state in an fp32 [B, NS, H, K, V] tensor; 0 unless
    SEGMENTED."""
    if SEGMENTED:
        base = ((i_b * tl.cdiv(T, seg_len) + i_s) * H + i_h) * (K * V)
        return tl.load(ptr + base + ck[:, None] * V + cv[None, :])
    else:
        return tl.zeros([K, BV], dtype=tl.float32)


@triton.jit
def _gla_short_fwd_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, o_ptr, oa_ptr, h_ptr, sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h,
    sv_d, sg_b, sg_t, sg_h, sg_d, so_b, so_t, so_h, so_d, T, H, scale, seg_len, programs,
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr, SEGMENTED: tl.constexpr,
):  # fmt: skip
    """o = the intra-chunk part in oa + the inter-chunk part (q_t * exp(b_t))^T S, for one (batch * head, segment,
    V tile): walks the segment's chunks with the [K, BV] state in registers, from h[segment] when SEGMENTED (else
    from 0, one segment). sq ... so are the operands' [B, T, H, D] strides (oa has o's); `programs` is only the
    autotuning key (see _autotuned)."""
    sq, sk, sv, sg, so = (
        (sq_b, sq_t, sq_h, sq_d),
        (sk_b, sk_t, sk_h, sk_d),
        (sv_b, sv_t, sv_h, sv_d),
        (sg_b, sg_t, sg_h, sg_d),
        (so_b, so_t, so_h, so_d),
    )
    # in fp32: torch.compile passes a Python float as fp64 (tuned.py)
    scale = tl.cast(scale, tl.float32)
    i_bh, i_v = tl.program_id(0), tl.program_id(2)
    i_b, i_h = (i_bh // H).to(tl.int64), (i_bh % H).to(tl.int64)
    i_s, start, end = _segment(T, seg_len)
    rt = tl.arange(0, CHUNK)
    ck = tl.arange(0, K)
    cv = i_v * BV + tl.arange(0, BV)
    state = _segment_state(h_ptr, i_b, i_s, i_h, T, seg_len, H, ck, cv, K, V, BV, SEGMENTED)
    for t0 in range(start, end, CHUNK):
        rows = t0 + rt
        q = _tile(q_ptr, sq, i_b, i_h, rows, ck, T) * scale
        k = _tile(k_ptr, sk, i_b, i_h, rows, ck, T)
        v = _tile(v_ptr, sv, i_b, i_h, rows, cv, T)
        b, b_last = _gates(g_ptr, sg, i_b, i_h, rows, ck, T)
        o = _tile(oa_ptr, so, i_b, i_h, rows, cv, T) + _mm(q * tl.exp(b), state, PRECISION)
        _store_tile(o_ptr, so, i_b, i_h, o, rows, cv, T)
        state = _carry(state, k, v, b, b_last, PRECISION)


@triton.jit
def _reverse_walk(
    q_ptr, k_ptr, v_ptr, g_ptr, do_ptr, dq_ptr, dk_ptr, dv_ptr, dg_ptr, dh_ptr, sq, sk, sv, sg, sdo, sgk, sgv,
    i_b, i_h, T, seg_len, H, scale, later, K: tl.constexpr, V: tl.constexpr, PRECISION: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DIRECT: tl.constexpr, SEGMENTED: tl.constexpr,
):  # fmt: skip
    """The backward's reverse walk over one (batch, head, segment) with dS, the gradient of the state that enters
    the later chunks (from dh[segment] when SEGMENTED: what the later segments ask of it): dq (its inter-chunk part
    read from dg), dk, dv and dgk. `later` [K]: the gate gradient's share from past the segment's end. DIRECT: the
    direct intra-chunk products (every chunk's |b| <= SAFE_LOG), else the levels."""
    i_s, start, end = _segment(T, seg_len)
    rt = tl.arange(0, CHUNK)
    ck = tl.arange(0, K)
    cv = tl.arange(0, V)
    causal = rt[:, None] >= rt[None, :]
    d_state = _segment_state(dh_ptr, i_b, i_s, i_h, T, seg_len, H, ck, cv, K, V, V, SEGMENTED)
    n_chunks = tl.cdiv(end - start, CHUNK)
    for i in range(0, n_chunks):
        t0 = start + (n_chunks - 1 - i) * CHUNK
        rows = t0 + rt
        q = _tile(q_ptr, sq, i_b, i_h, rows, ck, T) * scale
        k = _tile(k_ptr, sk, i_b, i_h, rows, ck, T)
        v = _tile(v_ptr, sv, i_b, i_h, rows, cv, T)
        do = _tile(do_ptr, sdo, i_b, i_h, rows, cv, T)
        b, b_last = _gates(g_ptr, sg, i_b, i_h, rows, ck, T)
        dq = _tile(dg_ptr, sgk, i_b, i_h, rows, ck, T)
        d_scores = _mm(do, tl.trans(v), INPUT_PRECISION)  # [t, s] = do_t . v_s (used where s <= t)
        if DIRECT:
            q_up, k_down = _direct_factors(q, k, b)
            scores = tl.where(causal, _mm(q_up, tl.trans(k_down), PRECISION), 0.0)
            d_causal = tl.where(causal, d_scores, 0.0)
            dq += tl.exp(b) * _mm(d_causal, k_down, PRECISION)
            dk = tl.exp(-b) * _mm(tl.trans(d_causal), q_up, PRECISION)
        else:
            d_diag = tl.sum(do * v, axis=1)[:, None]
            scores = tl.where(rt[:, None] == rt[None, :], tl.sum(q * k, axis=1)[:, None], 0.0)  # level by level
            dq += d_diag * k
            dk = d_diag * q
            for lv in tl.static_range(LEVELS):
                level_scores, q_f, k_f, f, late, same = _level(q, k, b, rt, CHUNK >> (lv + 1), PRECISION)
                scores += level_scores
                d_level = tl.where(same, d_scores, 0.0)
                dq += tl.where(late, f * _mm(d_level, k_f, PRECISION), 0.0)
                dk += tl.where(late, 0.0, f * _mm(tl.trans(d_level), q_f, PRECISION))
        to_end = tl.exp(b_last[None, :] - b)
        dv = _mm(tl.trans(scores), do, PRECISION) + _mm(k * to_end, d_state, PRECISION)
        dk += to_end * _mm(v, tl.trans(d_state), PRECISION)
        d = q * dq - k * dk
        _store_tile(dg_ptr, sgk, i_b, i_h, tl.cumsum(d, axis=0, reverse=True) + later[None, :], rows, ck, T)
        later += tl.sum(d, axis=0)
        _store_tile(dq_ptr, sgk, i_b, i_h, dq * scale, rows, ck, T)
        _store_tile(dk_ptr, sgk, i_b, i_h, dk, rows, ck, T)
        _store_tile(dv_ptr, sgv, i_b, i_h, dv, rows, cv, T)
        d_state = d_state * tl.exp(b_last)[:, None] + _mm(tl.trans(q * tl.exp(b)), do, PRECISION)


@triton.jit
def _gla_short_bwd_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, do_ptr, dq_ptr, dk_ptr, dv_ptr, dg_ptr, h_ptr, dh_ptr, sq_b, sq_t, sq_h, sq_d, sk_b,
    sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d, sg_b, sg_t, sg_h, sg_d, sdo_b, sdo_t, sdo_h, sdo_d, sgk_b, sgk_t, sgk_h,
    sgk_d, sgv_b, sgv_t, sgv_h, sgv_d, T, H, scale, seg_len, programs, K: tl.constexpr, V: tl.constexpr, PRECISION:
    tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    SEGMENTED: tl.constexpr,
):  # fmt: skip
    """dq, dk, dv and the fp32 dgk of one (batch * head, segment). dq, dk and dg share the strides sgk, dv has sgv.
    When SEGMENTED, h and dh (fp32 [B, NS, H, K, V]) hold the state entering each segment and the gradient of the
    state after it."""
    sq, sk, sv, sg, sdo, sgk, sgv = (
        (sq_b, sq_t, sq_h, sq_d),
        (sk_b, sk_t, sk_h, sk_d),
        (sv_b, sv_t, sv_h, sv_d),
        (sg_b, sg_t, sg_h, sg_d),
        (sdo_b, sdo_t, sdo_h, sdo_d),
        (sgk_b, sgk_t, sgk_h, sgk_d),
        (sgv_b, sgv_t, sgv_h, sgv_d),
    )
    # in fp32: torch.compile passes a Python float as fp64 (tuned.py)
    scale = tl.cast(scale, tl.float32)
    i_bh = tl.program_id(0)
    i_b, i_h = (i_bh // H).to(tl.int64), (i_bh % H).to(tl.int64)
    i_s, start, end = _segment(T, seg_len)
    rt = tl.arange(0, CHUNK)
    ck = tl.arange(0, K)
    cv = tl.arange(0, V)

    # Forward walk: the inter-chunk part of dq (w.r.t. the scaled q) = exp(b) * (do @ S^T), kept in dg.
    state = _segment_state(h_ptr, i_b, i_s, i_h, T, seg_len, H, ck, cv, K, V, V, SEGMENTED)
    span = tl.zeros([K], dtype=tl.float32)  # the largest |b| of any chunk so far
    for t0 in range(start, end, CHUNK):
        rows = t0 + rt
        k = _tile(k_ptr, sk, i_b, i_h, rows, ck, T)
        v = _tile(v_ptr, sv, i_b, i_h, rows, cv, T)
        do = _tile(do_ptr, sdo, i_b, i_h, rows, cv, T)
        b, b_last = _gates(g_ptr, sg, i_b, i_h, rows, ck, T)
        _store_tile(dg_ptr, sgk, i_b, i_h, _mm(do, tl.trans(state), PRECISION) * tl.exp(b), rows, ck, T)
        state = _carry(state, k, v, b, b_last, PRECISION)
        span = tl.maximum(span, _span(b))
    # The gate gradient's share from past the segment: sum over its later rows of q * dq - k * dk is dL/dgk at
    # the next segment's first row, sum_v S * dS of the state S after this segment and its gradient dS.
    if SEGMENTED:
        later = tl.sum(state * _segment_state(dh_ptr, i_b, i_s, i_h, T, seg_len, H, ck, cv, K, V, V, True), axis=1)
    else:
        later = tl.zeros([K], dtype=tl.float32)
    tl.debug_barrier()  # the reverse walk reads what every thread of this program wrote above

    args = (q_ptr, k_ptr, v_ptr, g_ptr, do_ptr, dq_ptr, dk_ptr, dv_ptr, dg_ptr, dh_ptr, sq, sk, sv, sg, sdo, sgk, sgv)
    if tl.max(span, axis=0) <= SAFE_LOG:
        _reverse_walk(*args, i_b, i_h, T, seg_len, H, scale, later, K, V, PRECISION, INPUT_PRECISION, True, SEGMENTED)
    else:
        _reverse_walk(*args, i_b, i_h, T, seg_len, H, scale, later, K, V, PRECISION, INPUT_PRECISION, False, SEGMENTED)


def _forward_configs(V: int) -> list[triton.Config]:
    """Autotune candidates of the forward: (V tile, warps, stages, register cap). Uncapped, the 4-warp program takes
    all 255 registers and two fit on an H100 SM; capped at 168 (a few spills) three fit, so LKAT-T's 384 programs
    run in one wave instead of two (0.195 -> 0.133 ms; benchmarks/bench_gla_registers.py). Fewer warps spill (sm_90).
    Loads pipelined over 3 stages won at 128 programs only (H200 autotuning: 0.048 against 0.055 ms)."""
    tiles = {(min(V, 64), 4, 1, 0), (min(V, 64), 4, 2, 0), (min(V, 64), 8, 1, 0), (min(V, 32), 4, 1, 0)}
    tiles |= {(min(V, 64), 4, 1, 168), (min(V, 64), 4, 1, 128), (min(V, 64), 4, 3, 0)}
    return [triton.Config({"BV": bv}, num_warps=w, num_stages=s, maxnreg=r or None) for bv, w, s, r in sorted(tiles)]


def _backward_configs(V: int) -> list[triton.Config]:
    """Autotune candidates of the backward: warps (the whole [K, V] gradient state sits in registers), for heads up
    to 64 wide a register cap of 168 (three programs per H100 SM: one wave for LKAT-T's 384), each with the walks'
    loads software-pipelined over 3 stages or not. Three stages won at 768 and 1536 programs (LKAT-S and LKAT-B at
    224², H200 autotuning: 0.421 against 0.469 ms and 0.834 against 0.925); LKAT-T's shape keeps the cap, 1 stage."""
    if V > 64:
        return [triton.Config({}, num_warps=w, num_stages=s) for w in (8, 16) for s in (1, 3)]
    caps = ((4, None), (8, None), (4, 168))
    return [triton.Config({}, num_warps=w, num_stages=s, maxnreg=r) for w, r in caps for s in (1, 3)]


def _intra_configs() -> list[triton.Config]:
    """Autotune candidates of the forward's intra-chunk kernel: one 16-row chunk per program, so few warps."""
    return [triton.Config({}, num_warps=w, num_stages=s) for w in (1, 2, 4) for s in (1, 2)]


_KERNELS = {"fwd_intra": _gla_short_fwd_intra_kernel, "fwd": _gla_short_fwd_kernel, "bwd": _gla_short_bwd_kernel}


@kernel_table([(kernel, V) for kernel in _KERNELS for V in HEAD_DIMS])
def _autotuned(kernel: str, V: int) -> TunedKernel:
    """The CUDA kernel `kernel` ("fwd_intra", "fwd" or "bwd") autotuned over its configurations, each keyed on K, V,
    the operand dtypes and `programs` (tuned.programs_key): how many programs share the SMs decides which warps and
    register budget win. The forward walk reads oa, which is o itself for fp32 outputs, so tuning restores it."""
    if kernel == "fwd_intra":
        tune = triton.autotune(configs=_intra_configs(), key=["K", "V", "programs"])
    elif kernel == "fwd":
        tune = triton.autotune(configs=_forward_configs(V), key=["K", "V", "programs"], restore_value=["oa_ptr"])
    else:
        tune = triton.autotune(configs=_backward_configs(V), key=["K", "V", "programs"])
    return TunedKernel(tune(_KERNELS[kernel]))


def _kernel(kernel: str, V: int) -> triton.runtime.KernelInterface | TunedKernel:
    """The kernel to launch: as written under the interpreter (a fixed configuration), else autotuned."""
    return _KERNELS[kernel] if INTERPRET else _autotuned(kernel, V)


def _precision(*xs: torch.Tensor) -> str:
    """The backward's tl.dot precision: exact fp32 products when every operand is fp32, else TF32 (16-bit operands
    bound it)."""
    return "ieee" if all(x.dtype == torch.float32 for x in xs) else "tf32"


def _input_precision(*xs: torch.Tensor) -> str:
    """tl.dot precision of a product whose operands are inputs as they come (do . v^T in the backward): "bf16" when
    they are all bf16 (bf16 x bf16 -> fp32: the exact products TF32 gives them too, at the 16-bit tensor cores' rate;
    the GPU tests cover bf16 and fp32, not fp16), else _precision. The interpreter's bf16 tl.dot is wrong (Triton
    3.8): there, _precision."""
    if INTERPRET or any(x.dtype != torch.bfloat16 for x in xs):
        return _precision(*xs)
    return "bf16"


def supports(key_dim: int, value_dim: int) -> bool:
    """Whether the kernels take these head dims (K and V in HEAD_DIMS)."""
    return key_dim in HEAD_DIMS and value_dim in HEAD_DIMS


def segment_length(T: int) -> int:
    """The segment length the kernels walk a T-token sequence in: SEGMENT from SEGMENTS_MIN_T tokens on, else 0
    (one walk over the whole sequence)."""
    return SEGMENT if T >= SEGMENTS_MIN_T else 0


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, segment: int) -> None:
    """Raise unless the operands and the segment length fit the kernels."""
    if q.dim() != 4 or v.dim() != 4 or q.shape != k.shape or q.shape != gk.shape or v.shape[:3] != q.shape[:3]:
        shapes = ", ".join(str(tuple(x.shape)) for x in (q, k, v, gk))
        raise ValueError(f"expected q, k, gk [B,T,H,K] and v [B,T,H,V], got {shapes}")
    if not supports(q.shape[-1], v.shape[-1]):
        raise ValueError(f"gla_short needs K and V in {HEAD_DIMS}, got K={q.shape[-1]}, V={v.shape[-1]}")
    if any(x.dtype not in INPUT_DTYPES for x in (q, k, v, gk)):
        raise ValueError(f"gla_short needs operands in {INPUT_DTYPES}")
    if segment and not chunk_states.is_chunk_size(segment):
        raise ValueError(f"gla_short's segments must be a power of two of 16 tokens or more, got {segment}")
    if not (q.is_cuda or INTERPRET):
        raise RuntimeError("gla_short needs CUDA tensors (or TRITON_INTERPRET=1 before importing triton)")


def _segments(T: int, segment: int) -> tuple[int, int]:
    """(rows per walk, walks per sequence): the segment length, or the whole sequence (in whole chunks) once."""
    if segment:
        return segment, cdiv(T, segment)
    return max(cdiv(T, CHUNK.value), 1) * CHUNK.value, 1


def _no_states(q: torch.Tensor) -> torch.Tensor:
    """The states output of an unsegmented forward: an empty fp32 tensor."""
    return q.new_empty(0, dtype=torch.float)


def gla_short_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, scale: float, segment: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, h): the GLA output [B, T, H, V] in q's dtype and, when segmented (segment > 0), the state entering each
    segment [B, NS, H, K, V] in fp32 (kept for the backward; empty otherwise)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    o = torch.empty(B, T, H, V, dtype=q.dtype, device=q.device)
    if o.numel() == 0:
        return o, _no_states(q)
    if segment:
        h = chunk_states.states_from_gates(k.contiguous(), v.contiguous(), gk, segment)
    else:
        h = _no_states(q)
    rows, walks = _segments(T, segment)
    # fp32 outputs take the intra-chunk part in place; 16-bit ones round the sum of both parts once
    accumulator = o if o.dtype == torch.float32 else torch.empty(o.shape, dtype=torch.float32, device=o.device)
    strides = (*q.stride(), *k.stride(), *v.stride(), *gk.stride(), *o.stride())
    meta = dict(K=K, V=V, PRECISION=_precision(q, k, v))
    chunks = cdiv(T, CHUNK.value)
    _kernel("fwd_intra", V)[(B * H, chunks)](
        q, k, v, gk, accumulator, *strides, T, H, scale, programs_key(B, H, chunks), **meta
    )
    args = (q, k, v, gk, o, accumulator, h, *strides, T, H, scale, rows, programs_key(B, H, walks))
    meta["SEGMENTED"] = bool(segment)
    if INTERPRET:
        block_v = min(V, _INTERP_BLOCK_V)
        _gla_short_fwd_kernel[(B * H, walks, V // block_v)](*args, BV=block_v, **meta)
    else:
        _autotuned("fwd", V)[lambda m: (B * H, walks, V // m["BV"])](*args, **meta)
    return o, h


def gla_short_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gk: torch.Tensor,
    h: torch.Tensor,
    do: torch.Tensor,
    scale: float,
    segment: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dgk) for the output gradient do, each in its operand's dtype, contiguous; h is the forward's."""
    B, T, H, K = q.shape
    dq, dk = torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(k.shape, dtype=k.dtype, device=q.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=q.device)
    dg = torch.empty(gk.shape, dtype=torch.float32, device=q.device)
    if not (dg.numel() and dv.numel()):
        dq.zero_(), dk.zero_(), dv.zero_(), dg.zero_()
        return dq, dk, dv, dg.to(gk.dtype)
    if segment:
        dh = chunk_states.state_grads_from_gates(q.contiguous(), do.contiguous(), gk, scale, segment)
    else:
        dh = h
    rows, walks = _segments(T, segment)
    strides = (*q.stride(), *k.stride(), *v.stride(), *gk.stride(), *do.stride(), *dg.stride(), *dv.stride())
    args = (q, k, v, gk, do, dq, dk, dv, dg, h, dh, *strides, T, H, scale, rows, programs_key(B, H, walks))
    meta = dict(
        K=K,
        V=v.shape[-1],
        PRECISION=_precision(q, k, v),
        INPUT_PRECISION=_input_precision(do, v),
        SEGMENTED=bool(segment),
    )
    _kernel("bwd", v.shape[-1])[(B * H, walks)](*args, **meta)
    return dq, dk, dv, dg.to(gk.dtype)


@torch.library.custom_op("lkat_lens::gla_short", mutates_args=())
def _gla_short_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, scale: float, segment: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward as a custom op (opaque to torch.compile)."""
    return gla_short_fwd(q, k, v, gk, scale, segment)


def empty_states(q: torch.Tensor, v: torch.Tensor, segment: int) -> torch.Tensor:
    """An uninitialised tensor of the shape gla_short_fwd's states h take for these operands (fake tensors)."""
    B, T, H, K = q.shape
    if not segment or B * T * H * K * v.shape[-1] == 0:
        return _no_states(q)
    return q.new_empty(B, cdiv(T, segment), H, K, v.shape[-1], dtype=torch.float)


@_gla_short_op.register_fake
def _gla_short_fake(q, k, v, gk, scale, segment):
    return q.new_empty(*q.shape[:3], v.shape[-1]), empty_states(q, v, segment)


@torch.library.custom_op("lkat_lens::gla_short_backward", mutates_args=())
def _gla_short_backward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gk: torch.Tensor,
    h: torch.Tensor,
    do: torch.Tensor,
    scale: float,
    segment: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward as a custom op."""
    return gla_short_bwd(q, k, v, gk, h, do, scale, segment)


@_gla_short_backward_op.register_fake
def _gla_short_backward_fake(q, k, v, gk, h, do, scale, segment):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), gk.new_empty(gk.shape)


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    q, k, v, gk, scale, segment = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(q, k, v, gk, output[1])
    ctx.args = (scale, segment)


def _backward(ctx, do: torch.Tensor, _dh, kernel) -> tuple:
    return (*kernel(*ctx.saved_tensors, do, *ctx.args), None, None)


# The forward and the backward as kernels.Kernel: set for CUDA graphs, gla_core calls them inside its traced
# autograd.Function, where torch.compile keeps each one opaque op launched by our autotuner (gla_core says why)
SHORT_FORWARD = Kernel(_gla_short_op, gla_short_fwd)
SHORT_BACKWARD = Kernel(_gla_short_backward_op, gla_short_bwd)
_gla_short = differentiable(SHORT_FORWARD, SHORT_BACKWARD, _backward, _setup_context)


def gla_short(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gk: torch.Tensor,
    scale: float | None = None,
    segment: int | None = None,
):
    """Differentiable GLA output [B, T, H, V] (q's dtype) by the on-chip kernels, walking segments of `segment`
    tokens in parallel (0: the whole sequence in one walk; None: segment_length(T))."""
    segment = segment_length(q.shape[1]) if segment is None else int(segment)
    _check(q, k, v, gk, segment)
    return _gla_short(q, k, v, gk, q.shape[-1] ** -0.5 if scale is None else float(scale), segment)[0]
