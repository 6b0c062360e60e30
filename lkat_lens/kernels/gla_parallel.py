"""Gated Linear Attention for short sequences in its parallel (quadratic) form: no serial walk over the sequence.

Layout is fla's: q, k, gk [B, T, H, K], v [B, T, H, V], gk the log forget gate (<= 0), any strides.
o_t = scale * sum_{s <= t} A[t, s] v_s with A[t, s] = sum_k q_t k_s exp(b_t - b_s), b = cumsum of gk over t
(the recurrence of `kernels.gla` unrolled). The op takes b itself, fp32: `gla_parallel` forms it with torch's
cumsum outside the op, so that torch.compile fuses it with the gate's own elementwise work and autograd turns the
op's gradient w.r.t. b into dgk (its reverse cumsum).

Every program owns one chunk of CHUNK = 16 rows (the short kernels' chunk, `kernels.gla_short`), so a sequence of T
tokens runs as ceil(T / 16) programs per (batch, head) instead of one walking all of it. Per chunk:
- its own 16 x 16 block of A: the short kernels' intra-chunk code, direct products while the chunk's |b| (from its
  start) is at most SAFE_LOG, else the binary levels, safe for any gates;
- every other block in tiles of BS rows, factored around the chunk's edge r as exp(b_t - b_r) * exp(b_r - b_s),
  with s <= r < t: both factors are <= 1, nothing can overflow, one tl.dot per tile.
The forward's program takes the keys before its chunk and writes o. The backward is two kernels: one per query
chunk (dq, and q * dq into the fp32 gradient of b), then one per key chunk (the queries after it: dk, dv, and
subtracts k * dk from b's gradient, which is dL/db_t = q_t * dq_t - k_t * dk_t). Nothing is saved but q, k, v, b.

At T = 201 with heads of 64 the pairs cost about as many products as the short kernels' state updates (T is about
3 K); they grow with T^2, so `kernels.gla`'s "auto" takes this form up to AUTO_PARALLEL_MAX_T tokens only.
Every tl.dot takes fp32 operands with fp32 accumulation: TF32 for 16-bit inputs, exact when all are fp32.
On CUDA the kernels are autotuned; with TRITON_INTERPRET=1 set before triton is first imported they run on CPU
tensors through the Triton interpreter. The ops are torch custom ops: torch.compile keeps each as one call.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .autograd_ops import differentiable
from .gla_short import (
    CHUNK,
    INTERPRET,
    LEVELS,
    SAFE_LOG,
    _direct_factors,
    _level,
    _level_scores,
    _mm,
    _precision,
    _span,
    _store_tile,
    _tile,
    check_operands,
)

# Rows per tile of the other chunks' keys (forward, dq) or queries (dk, dv) under the interpreter; autotuned on CUDA.
_INTERP_BS = 32


@triton.jit
def _before(b_ptr, sb, i_b, i_h, t0, ck):
    """b at row t0 - 1, the cumsum of the gates before row t0 ([K]; zeros for t0 = 0)."""
    row = tl.load(b_ptr + i_b * sb[0] + i_h * sb[2] + tl.maximum(t0 - 1, 0) * sb[1] + ck * sb[3])
    return tl.where(t0 > 0, row, 0.0)


@triton.jit
def _chunk_cumsum(b_ptr, sb, i_b, i_h, rows, ck, T, ref):
    """A chunk's gate cumsum from its start, b - ref [CHUNK, K]; rows past T repeat the last row (so the chunk's
    cumsum stays non-increasing, as the short kernels' is)."""
    b = _tile(b_ptr, sb, i_b, i_h, rows, ck, T) - ref[None, :]
    valid = (rows < T)[:, None]
    return tl.where(valid, b, tl.min(tl.where(valid, b, float("inf")), axis=0)[None, :])


@triton.jit
def _decayed(x, exponent, keep):
    """x * exp(exponent) on rows `keep`, 0 elsewhere (exponents outside `keep` are never exponentiated)."""
    return x * tl.exp(tl.where(keep, exponent, float("-inf")))


@triton.jit
def _earlier_keys(k_ptr, v_ptr, b_ptr, sk, sv, sb, i_b, i_h, s0, t0, ref, rs, ck, cv, T):
    """The tile of keys s0 + rs before row t0: (k * exp(ref - b_s), v), zero from row t0 on (ref = b_{t0 - 1})."""
    keys = s0 + rs
    earlier = (keys < t0)[:, None]
    k = _tile(k_ptr, sk, i_b, i_h, keys, ck, T)
    k_dec = _decayed(k, ref[None, :] - _tile(b_ptr, sb, i_b, i_h, keys, ck, T), earlier)
    return k_dec, _tile(v_ptr, sv, i_b, i_h, keys, cv, T)


@triton.jit
def _gla_parallel_fwd_kernel(
    q_ptr, k_ptr, v_ptr, b_ptr, o_ptr, sq, sk, sv, sb, so, T, H, scale,
    K: tl.constexpr, V: tl.constexpr, BS: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """o for one (chunk, batch * head): the chunk's own block, then the earlier keys tile by tile."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = (i_bh // H).to(tl.int64), (i_bh % H).to(tl.int64)
    rt, rs = tl.arange(0, CHUNK), tl.arange(0, BS)
    ck, cv = tl.arange(0, K), tl.arange(0, V)
    t0 = i_c * CHUNK
    rows = t0 + rt
    q = _tile(q_ptr, sq, i_b, i_h, rows, ck, T) * scale
    k = _tile(k_ptr, sk, i_b, i_h, rows, ck, T)
    ref = _before(b_ptr, sb, i_b, i_h, t0, ck)
    b = _chunk_cumsum(b_ptr, sb, i_b, i_h, rows, ck, T, ref)
    if tl.max(_span(b), axis=0) <= SAFE_LOG:
        q_up, k_down = _direct_factors(q, k, b)
        scores = tl.where(rt[:, None] >= rt[None, :], _mm(q_up, tl.trans(k_down), PRECISION), 0.0)
    else:
        scores = _level_scores(q, k, b, rt, PRECISION)
    o = _mm(scores, _tile(v_ptr, sv, i_b, i_h, rows, cv, T), PRECISION)
    q_dec = q * tl.exp(b)  # exp(b_t - b_{t0 - 1}) <= 1
    for s0 in range(0, t0, BS):
        k_dec, v_s = _earlier_keys(k_ptr, v_ptr, b_ptr, sk, sv, sb, i_b, i_h, s0, t0, ref, rs, ck, cv, T)
        o += _mm(_mm(q_dec, tl.trans(k_dec), PRECISION), v_s, PRECISION)
    _store_tile(o_ptr, so, i_b, i_h, o, rows, cv, T)


@triton.jit
def _gla_parallel_dq_kernel(
    q_ptr, k_ptr, v_ptr, b_ptr, do_ptr, dq_ptr, db_ptr, sq, sk, sv, sb, sdo, sgk, T, H, scale,
    K: tl.constexpr, V: tl.constexpr, BS: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """dq of one query chunk, and q * dq into db (fp32; dq and db share the strides sgk)."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = (i_bh // H).to(tl.int64), (i_bh % H).to(tl.int64)
    rt, rs = tl.arange(0, CHUNK), tl.arange(0, BS)
    ck, cv = tl.arange(0, K), tl.arange(0, V)
    t0 = i_c * CHUNK
    rows = t0 + rt
    q = _tile(q_ptr, sq, i_b, i_h, rows, ck, T) * scale
    k = _tile(k_ptr, sk, i_b, i_h, rows, ck, T)
    v = _tile(v_ptr, sv, i_b, i_h, rows, cv, T)
    do = _tile(do_ptr, sdo, i_b, i_h, rows, cv, T)
    ref = _before(b_ptr, sb, i_b, i_h, t0, ck)
    b = _chunk_cumsum(b_ptr, sb, i_b, i_h, rows, ck, T, ref)
    d_scores = _mm(do, tl.trans(v), PRECISION)  # [t, s] = do_t . v_s
    if tl.max(_span(b), axis=0) <= SAFE_LOG:
        k_down = _direct_factors(q, k, b)[1]
        dq = tl.exp(b) * _mm(tl.where(rt[:, None] >= rt[None, :], d_scores, 0.0), k_down, PRECISION)
    else:
        dq = tl.sum(do * v, axis=1)[:, None] * k
        for lv in tl.static_range(LEVELS):
            _, q_f, k_f, f, late, same = _level(q, k, b, rt, CHUNK >> (lv + 1), PRECISION)
            dq += tl.where(late, f * _mm(tl.where(same, d_scores, 0.0), k_f, PRECISION), 0.0)
    earlier = tl.zeros([CHUNK, K], dtype=tl.float32)
    for s0 in range(0, t0, BS):
        k_dec, v_s = _earlier_keys(k_ptr, v_ptr, b_ptr, sk, sv, sb, i_b, i_h, s0, t0, ref, rs, ck, cv, T)
        earlier += _mm(_mm(do, tl.trans(v_s), PRECISION), k_dec, PRECISION)
    dq += tl.exp(b) * earlier
    _store_tile(dq_ptr, sgk, i_b, i_h, dq * scale, rows, ck, T)
    _store_tile(db_ptr, sgk, i_b, i_h, q * dq, rows, ck, T)


@triton.jit
def _gla_parallel_dkv_kernel(
    q_ptr, k_ptr, v_ptr, b_ptr, do_ptr, dk_ptr, dv_ptr, db_ptr, sq, sk, sv, sb, sdo, sgk, sgv, T, H, scale,
    K: tl.constexpr, V: tl.constexpr, BS: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """dk and dv of one key chunk, and db -= k * dk (after _gla_parallel_dq_kernel wrote q * dq there)."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = (i_bh // H).to(tl.int64), (i_bh % H).to(tl.int64)
    rt, rs = tl.arange(0, CHUNK), tl.arange(0, BS)
    ck, cv = tl.arange(0, K), tl.arange(0, V)
    s0 = i_c * CHUNK
    rows = s0 + rt
    q = _tile(q_ptr, sq, i_b, i_h, rows, ck, T) * scale
    k = _tile(k_ptr, sk, i_b, i_h, rows, ck, T)
    v = _tile(v_ptr, sv, i_b, i_h, rows, cv, T)
    do = _tile(do_ptr, sdo, i_b, i_h, rows, cv, T)
    ref = _before(b_ptr, sb, i_b, i_h, s0, ck)
    b = _chunk_cumsum(b_ptr, sb, i_b, i_h, rows, ck, T, ref)
    d_scores = _mm(do, tl.trans(v), PRECISION)
    if tl.max(_span(b), axis=0) <= SAFE_LOG:
        q_up, k_down = _direct_factors(q, k, b)
        causal = rt[:, None] >= rt[None, :]
        scores = tl.where(causal, _mm(q_up, tl.trans(k_down), PRECISION), 0.0)
        dk = tl.exp(-b) * _mm(tl.trans(tl.where(causal, d_scores, 0.0)), q_up, PRECISION)
    else:
        scores = tl.where(rt[:, None] == rt[None, :], tl.sum(q * k, axis=1)[:, None], 0.0)
        dk = tl.sum(do * v, axis=1)[:, None] * q
        for lv in tl.static_range(LEVELS):
            level_scores, q_f, k_f, f, late, same = _level(q, k, b, rt, CHUNK >> (lv + 1), PRECISION)
            scores += level_scores
            dk += tl.where(late, 0.0, f * _mm(tl.trans(tl.where(same, d_scores, 0.0)), q_f, PRECISION))
    dv = _mm(tl.trans(scores), do, PRECISION)
    # later queries t > the chunk's last row e: exp(b_t - b_s) = exp(b_t - b_e) * exp(b_e - b_s), both <= 1
    end = tl.min(b, axis=0)  # b_e - ref
    to_end = tl.exp(end[None, :] - b)
    k_dec = k * to_end
    later = tl.zeros([CHUNK, K], dtype=tl.float32)
    for t0 in range(s0 + CHUNK, T, BS):
        queries = t0 + rs
        q_t = _tile(q_ptr, sq, i_b, i_h, queries, ck, T) * scale
        b_t = _tile(b_ptr, sb, i_b, i_h, queries, ck, T) - ref[None, :]
        q_dec = _decayed(q_t, b_t - end[None, :], (queries < T)[:, None])
        do_t = _tile(do_ptr, sdo, i_b, i_h, queries, cv, T)
        dv += _mm(_mm(k_dec, tl.trans(q_dec), PRECISION), do_t, PRECISION)
        later += _mm(_mm(v, tl.trans(do_t), PRECISION), q_dec, PRECISION)
    dk += to_end * later
    _store_tile(dk_ptr, sgk, i_b, i_h, dk, rows, ck, T)
    _store_tile(dv_ptr, sgv, i_b, i_h, dv, rows, cv, T)
    _store_tile(db_ptr, sgk, i_b, i_h, _tile(db_ptr, sgk, i_b, i_h, rows, ck, T) - k * dk, rows, ck, T)


def _configs() -> list[triton.Config]:
    """Autotune candidates: (rows per tile of the other chunks, warps, stages)."""
    return [triton.Config({"BS": bs}, num_warps=w, num_stages=s) for bs in (32, 64) for w in (2, 4, 8) for s in (1, 2)]


_KERNELS = {"fwd": _gla_parallel_fwd_kernel, "dq": _gla_parallel_dq_kernel, "dkv": _gla_parallel_dkv_kernel}


@functools.cache
def _autotuned(kernel: str) -> triton.runtime.KernelInterface:
    """The CUDA kernel `kernel` autotuned over _configs, keyed on the head dims, the length and the dtypes."""
    restore = ["db_ptr"] if kernel == "dkv" else []  # db is read and written: every trial starts from dq's db
    return triton.autotune(configs=_configs(), key=["K", "V", "T"], restore_value=restore)(_KERNELS[kernel])


def _launch(kernel: str, T: int, heads: int, args: tuple, **meta) -> None:
    """Launch `kernel` on (chunks of T, batch * heads) programs: autotuned on CUDA, a fixed tile under the
    interpreter."""
    grid = (triton.cdiv(T, CHUNK.value), heads)
    if INTERPRET:
        _KERNELS[kernel][grid](*args, **meta, BS=_INTERP_BS)
    else:
        _autotuned(kernel)[grid](*args, **meta)


def gla_parallel_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """GLA output [B, T, H, V] in q's dtype from the fp32 gate cumsum b."""
    B, T, H, K = q.shape
    o = torch.empty(B, T, H, v.shape[-1], dtype=q.dtype, device=q.device)
    if o.numel():
        strides = (q.stride(), k.stride(), v.stride(), b.stride(), o.stride())
        meta = dict(K=K, V=v.shape[-1], PRECISION=_precision(q, k, v))
        _launch("fwd", T, B * H, (q, k, v, b, o, *strides, T, H, scale), **meta)
    return o


def gla_parallel_bwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, do: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, db) for the output gradient do: dq, dk, dv in their operands' dtypes, db fp32, all contiguous."""
    B, T, H, K = q.shape
    dq, dk = torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(k.shape, dtype=k.dtype, device=q.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=q.device)
    db = torch.empty(b.shape, dtype=torch.float32, device=q.device)
    if not (db.numel() and dv.numel()):
        dq.zero_(), dk.zero_(), dv.zero_(), db.zero_()
        return dq, dk, dv, db
    meta = dict(K=K, V=v.shape[-1], PRECISION=_precision(q, k, v))
    operands = (q.stride(), k.stride(), v.stride(), b.stride(), do.stride(), db.stride())
    _launch("dq", T, B * H, (q, k, v, b, do, dq, db, *operands, T, H, scale), **meta)
    _launch("dkv", T, B * H, (q, k, v, b, do, dk, dv, db, *operands, dv.stride(), T, H, scale), **meta)
    return dq, dk, dv, db


@torch.library.custom_op("lkat_lens::gla_parallel", mutates_args=())
def _gla_parallel_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """The forward as a custom op (opaque to torch.compile)."""
    return gla_parallel_fwd(q, k, v, b, scale)


@_gla_parallel_op.register_fake
def _gla_parallel_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, scale: float):
    return q.new_empty(*q.shape[:3], v.shape[-1])


@torch.library.custom_op("lkat_lens::gla_parallel_backward", mutates_args=())
def _gla_parallel_backward_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, do: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward as a custom op."""
    return gla_parallel_bwd(q, k, v, b, do, scale)


@_gla_parallel_backward_op.register_fake
def _gla_parallel_backward_fake(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, do: torch.Tensor, scale: float
):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), b.new_empty(b.shape, dtype=torch.float32)


def _setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    q, k, v, b, scale = inputs
    ctx.save_for_backward(q, k, v, b)
    ctx.scale = scale


def _backward(ctx, do: torch.Tensor) -> tuple:
    return (*_gla_parallel_backward_op(*ctx.saved_tensors, do, ctx.scale), None)


_gla_parallel = differentiable(_gla_parallel_op, _backward, _setup_context)


def gla_parallel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, scale: float | None = None):
    """Differentiable GLA output [B, T, H, V] (q's dtype) by the parallel-form kernels."""
    check_operands("gla_parallel", q, k, v, gk)
    b = gk.to(torch.float32).cumsum(1)
    return _gla_parallel(q, k, v, b, q.shape[-1] ** -0.5 if scale is None else float(scale))
