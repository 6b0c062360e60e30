"""Gated Linear Attention ops: exact torch recurrence and chunked form, fla kernels on CUDA, implicit attention.

Layout is fla's: q, k, gk are [B, T, H, K], v is [B, T, H, V], gk is the log forget gate (<= 0).
Recurrence: S_t = diag(exp(gk_t)) S_{t-1} + k_t v_t^T (S: [K, V]), o_t = scale * S_t^T q_t, scale = K^-0.5.
States are [B, H, K, V]. The torch paths accumulate in fp32 (fp64 for fp64 inputs) and return q.dtype.

Dispatcher modes (`gated_linear_attention`):
- "chunk": fla's `chunk_gla` on CUDA (chunk-parallel; what "auto" takes for head dims the short kernels lack).
- "fused_recurrent": fla's `fused_recurrent_gla` on CUDA (one fused sequential kernel; best for short ones).
- "short": `kernels.gla_short` on CUDA (one program per (batch, head, segment) keeps the state on chip; from
  gla_short.SEGMENTS_MIN_T tokens a sequence is walked in segments of gla_short.SEGMENT, the states between them
  passed in parallel; head dims 16..128). A torch custom op: torch.compile does not break the graph there.
- "auto": "fused_recurrent" for fp32 inputs or T <= AUTO_RECURRENT_MAX_T; otherwise "short" (head dims permitting),
  else "chunk". The length sweep (`bench_gla.py --lengths 16389 4101 1029 513 201`, bf16, tokens per batch held at
  128 x 201, 6 heads of 64, each replayed as a CUDA graph, so that the GPU's time is compared and not Python's
  dispatch; H200, 2026-11-26): short's forward + backward took 0.71, 0.76, 0.81, 0.81 and 0.60x chunk's time (chunk
  with its states passed in parallel) at T = 16,389, 4,101, 1,029, 513 and 201, its forward alone 0.83, 0.92, 1.02,
  1.00 and 0.69x (an H100: 0.64, 0.71, 0.76, 0.75 and 0.55x; forward 0.76, 0.88, 1.00, 0.97 and 0.64x); the GPU
  tests check it against the fp64 recurrence at every T (tests/gpu/test_gla_short_gpu.py).
  Before the segments (one walk per sequence, H100 sweep of 2026-11-25) short lost from about 1,280 tokens on
  (1.08x at 1,537, 1.38x at 2,048), and "auto" took chunk there. Inference takes short too: in CUDA-graphed LKAT-T
  and LKAT-S forwards (bench_model.py --compare --attn auto short, one run each) short gave 23,320 and 10,680 img/s
  against chunk's 20,330 and 10,320. fla 0.6.0's `chunk_gla` faults with "CUDA error: misaligned address" on fp32
  inputs (seen on an H100, torch 2.11, Triton 3.6; the fault poisons the CUDA context); `fused_recurrent_gla` is
  accurate there. At T = 21, B = 32, H = 6, K = V = 64 in bf16 on an H100, forward + backward took 1.0 ms
  fused_recurrent, 2.5 ms chunk.
- "torch": `gla_chunked` with TORCH_CHUNK_SIZE, the exact torch form (the fastest chunk size measured on CPU).
  Inputs on the CPU take this path whatever the mode (fla's Triton kernels cannot run there; fla is imported only
  when a CUDA path is taken), except mode "short" under the Triton interpreter (`kernel_path`).
fla's kernels and "short" run as torch custom ops (`kernels.gla_fla`, `kernels.gla_short`): torch.compile traces
a GLA layer whole, with no graph break.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import gla_fla, gla_short
from .dtypes import compute_dtype
from .host_math import cdiv

MODES = ("auto", "chunk", "fused_recurrent", "short", "torch")
AUTO_RECURRENT_MAX_T = 64
TORCH_CHUNK_SIZE = 32
SUB_CHUNK = 4


def _heads_first(dtype: torch.dtype, *xs: torch.Tensor) -> list[torch.Tensor]:
    """[B, T, H, D] tensors as [B, H, T, D] in `dtype`."""
    return [x.transpose(1, 2).to(dtype) for x in xs]


def _default_scale(q: torch.Tensor, scale: float | None) -> float:
    """The attention scale, K^-0.5 unless given."""
    return q.shape[-1] ** -0.5 if scale is None else scale


def gla_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gk: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Exact GLA by the plain sequential recurrence (the reference): (o [B,T,H,V], final state [B,H,K,V] or None)."""
    scale = _default_scale(q, scale)
    dtype = compute_dtype(q)
    qh, kh, vh, gh = _heads_first(dtype, q, k, v, gk)
    B, H, T, K = qh.shape
    state = qh.new_zeros(B, H, K, vh.shape[-1]) if initial_state is None else initial_state.to(dtype)
    outs = []
    for t in range(T):
        state = gh[:, :, t, :, None].exp() * state + kh[:, :, t, :, None] * vh[:, :, t, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", qh[:, :, t], state))
    o = (torch.stack(outs, dim=1) * scale).to(q.dtype)
    return o, (state if output_final_state else None)


def _masked_exp(mask: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """exp(exponent) where mask, exactly 0 elsewhere (the masked exponents are never exponentiated)."""
    return torch.where(mask, exponent, float("-inf")).exp()


def _diagonal_block(q: torch.Tensor, k: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Causal [..., c, c] scores sum_k q_t k_s exp(b_t - b_s) for s <= t, from [..., c, K] blocks."""
    c = q.shape[-2]
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril().unsqueeze(-1)
    decay = _masked_exp(causal, b.unsqueeze(-2) - b.unsqueeze(-3))
    return (q.unsqueeze(-2) * k.unsqueeze(-3) * decay).sum(-1)


def _intra_chunk_scores(q: torch.Tensor, k: torch.Tensor, b: torch.Tensor, sub: int) -> torch.Tensor:
    """Causal [..., L, L] scores sum_k q_t k_s exp(b_t - b_s) for chunks [..., L, K] (b non-increasing, L % sub == 0).

    Sub-chunks of `sub` rows: diagonal blocks take exp of each difference. For query sub-chunk i and an
    earlier key sub-chunk j, exp(b_t - b_s) = exp(b_t - f_i) * exp(f_i - f_{j+1}) * exp(f_{j+1} - b_s) with
    f_i the first row of sub-chunk i: every factor is exp of a difference <= 0, so none can overflow.
    """
    L = q.shape[-2]
    ns = L // sub
    qs, ks, bs = (x.unflatten(-2, (ns, sub)) for x in (q, k, b))
    diag = _diagonal_block(qs, ks, bs)
    if ns == 1:
        return diag.squeeze(-3)
    first = bs[..., :1, :]
    after = torch.cat([first[..., 1:, :, :], bs[..., -1:, -1:, :]], dim=-3)
    q_dec = qs * (bs - first).exp()
    k_dec = ks * (after - bs).exp()
    earlier = torch.ones(ns, ns, dtype=torch.bool, device=q.device).tril(-1).unsqueeze(-1)
    between = _masked_exp(earlier, first.squeeze(-2).unsqueeze(-2) - after.squeeze(-2).unsqueeze(-3))
    k_all = (k_dec.unsqueeze(-4) * between.unsqueeze(-2)).flatten(-3, -2)
    off = (q_dec @ k_all.transpose(-1, -2)).unflatten(-1, (ns, sub))
    on_diag = torch.eye(ns, dtype=torch.bool, device=q.device)[:, None, :, None]
    return torch.where(on_diag, diag.unsqueeze(-2), off).flatten(-4, -3).flatten(-2, -1)


def _sub_chunk_size(chunk_size: int) -> int:
    """Largest divisor of chunk_size that is at most SUB_CHUNK."""
    return next(s for s in range(min(SUB_CHUNK, chunk_size), 0, -1) if chunk_size % s == 0)


def gla_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gk: torch.Tensor,
    scale: float | None = None,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Exact GLA in chunk-parallel torch form, differentiable: (o [B,T,H,V], final state [B,H,K,V] or None).

    T is split into equal chunks of at most `chunk_size` (padded at the end); inside a chunk the scores are
    parallel, across chunks the state is carried. Chunk-local cumsums keep every exp argument <= 0.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    scale = _default_scale(q, scale)
    dtype = compute_dtype(q)
    qh, kh, vh, gh = _heads_first(dtype, q, k, v, gk)
    T = qh.shape[2]
    sub = _sub_chunk_size(chunk_size)
    n = cdiv(T, chunk_size)
    size = cdiv(T, n * sub) * sub
    pad = n * size - T
    qh, kh, vh, gh = (F.pad(x, (0, 0, 0, pad)) for x in (qh * scale, kh, vh, gh))
    state = None if initial_state is None else initial_state.to(dtype)
    outs = []
    for start in range(0, n * size, size):
        qc, kc, vc, gc = (x[:, :, start : start + size] for x in (qh, kh, vh, gh))
        b = gc.cumsum(-2)
        o = _intra_chunk_scores(qc, kc, b, sub) @ vc
        outs.append(o if state is None else o + (qc * b.exp()) @ state)
        if start + size < T or output_final_state:
            b_last = b[..., -1:, :]
            kv = (kc * (b_last - b).exp()).transpose(-1, -2) @ vc
            state = kv if state is None else b_last.transpose(-1, -2).exp() * state + kv
    o = torch.cat(outs, dim=2)[:, :, :T].transpose(1, 2).to(q.dtype)
    return o, (state if output_final_state else None)


def gated_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gk: torch.Tensor,
    scale: float | None = None,
    mode: str = "auto",
) -> torch.Tensor:
    """GLA output [B, T, H, V]: Triton kernels on CUDA, the exact torch chunked form on CPU or with mode "torch"."""
    scale = _default_scale(q, scale)
    path = kernel_path(mode, q.device, q.shape[1], q.dtype, q.shape[-1], v.shape[-1])
    if path == "torch":
        return gla_chunked(q, k, v, gk, scale=scale, chunk_size=TORCH_CHUNK_SIZE)[0]
    if path == "short":
        return gla_short.gla_short(q, k, v, gk, scale)
    return gla_fla.fla_gla(q, k, v, gk, scale, path)


def kernel_path(mode: str, device: torch.device, length: int, dtype: torch.dtype, key_dim: int, value_dim: int) -> str:
    """The path gated_linear_attention takes in `mode` for q [B, length, H, key_dim] of this device and dtype and v
    of value_dim channels (training or not): "torch" on the CPU or in mode "torch", "short" in mode "short" under the
    Triton interpreter too (which runs the short kernels on the CPU), else the CUDA kernel of the mode, for "auto" the
    rule in the module docstring."""
    if mode not in MODES:
        raise ValueError(f"unknown GLA mode {mode!r}; expected one of {MODES}")
    if mode == "short" and gla_short.INTERPRET:
        return "short"
    if mode == "torch" or device.type != "cuda":
        return "torch"
    if mode != "auto":
        return mode
    if length <= AUTO_RECURRENT_MAX_T or dtype == torch.float32:
        return "fused_recurrent"
    return "short" if gla_short.supports(key_dim, value_dim) else "chunk"


def _prefix_sums(gk: torch.Tensor) -> torch.Tensor:
    """G = cumsum of the gates over t, [B, H, T, K] in fp64 so that differences G_t - G_s keep full precision."""
    return gk.transpose(1, 2).to(torch.float64).cumsum(2)


def _causal_scores(q: torch.Tensor, k: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Causal [..., L, L] scores sum_k q_t k_s exp(b_t - b_s) for any L (b non-increasing along L)."""
    L = q.shape[-2]
    pad = -L % SUB_CHUNK
    q, k = (F.pad(x, (0, 0, 0, pad)) for x in (q, k))
    b = torch.cat([b, b[..., -1:, :].expand(*b.shape[:-2], pad, b.shape[-1])], dim=-2)
    return _intra_chunk_scores(q, k, b, SUB_CHUNK)[..., :L, :L]


def implicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    gk: torch.Tensor,
    scale: float | None = None,
    block_size: int = 64,
) -> torch.Tensor:
    """Implicit attention A [B, H, T, T] (fp32, fp64 for fp64 inputs) with o = A @ v; zero above the diagonal.

    A[t, s] = scale * sum_k q_t[k] k_s[k] exp(G_t[k] - G_s[k]) for s <= t, G = cumsum of gk over t.
    Rows go in blocks of `block_size`: keys inside the block as in `gla_chunked`, earlier keys factored
    around the block's first row r as exp(G_t - G_r) * exp(G_r - G_s), both <= 1.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    scale = _default_scale(q, scale)
    dtype = compute_dtype(q)
    qh, kh = _heads_first(dtype, q, k)
    qh = qh * scale
    G = _prefix_sums(gk)
    B, H, T, _ = qh.shape
    A = qh.new_zeros(B, H, T, T)
    for r in range(0, T, block_size):
        e = min(r + block_size, T)
        ref = G[:, :, r : r + 1]
        b = (G[:, :, r:e] - ref).to(dtype)
        A[:, :, r:e, r:e] = _causal_scores(qh[:, :, r:e], kh[:, :, r:e], b)
        if r:
            k_dec = kh[:, :, :r] * (ref - G[:, :, :r]).to(dtype).exp()
            A[:, :, r:e, :r] = (qh[:, :, r:e] * b.exp()) @ k_dec.transpose(-1, -2)
    return A


def implicit_attention_row(
    q: torch.Tensor,
    k: torch.Tensor,
    gk: torch.Tensor,
    t: int,
    scale: float | None = None,
) -> torch.Tensor:
    """Row t of the implicit attention matrix, [B, H, T] (negative t counts from the end)."""
    scale = _default_scale(q, scale)
    qh, kh = _heads_first(compute_dtype(q), q, k)
    T = qh.shape[2]
    if not -T <= t < T:
        raise IndexError(f"query row {t} out of range for T = {T}")
    t = t % T
    G = _prefix_sums(gk)
    decay = (G[:, :, t : t + 1] - G[:, :, : t + 1]).to(qh.dtype).exp()
    row = torch.einsum("bhk,bhsk->bhs", qh[:, :, t] * scale, kh[:, :, : t + 1] * decay)
    return F.pad(row, (0, T - t - 1))
