"""fla's GLA kernels (`chunk_gla`, `fused_recurrent_gla`) as torch custom ops, so torch.compile keeps them in its graph.

Opaque ops keep inductor out of fla's Triton kernels (recompiling them failed on `fused_recurrent_bwd_kernel`
with torch 2.11 / Triton 3.6, which is why they ran under torch.compiler.disable, a graph break, before).
Each mode is a forward op and a backward op (layout and gates as in `kernels.gla`; outputs in q's dtype,
gradients in their operand's dtype). q, k, v and gk are saved, and in chunk mode what fla's own autograd function
keeps from its forward too: the chunk-local gate cumsum g_cumsum and the intra-chunk scores A (fp32, [B, T, H, K]
and [B, T, H, chunk]), which the forward op returns beside o (not differentiable). Recomputing them instead (as
before) took 2.6 ms more of an LKAT-S training step's kernel time at 2048^2 (45.4 against 42.8 ms, H200) for 528
MiB less per image (3,986 against 4,514; ViT-S 2,936). The chunk backward runs fla's `chunk_gla_bwd`, which
recomputes the chunk states as fla's own backward does. The fused-recurrent backward is fla's `fused_recurrent_bwd`
(its saved output is read only for gv, which GLA has not). The functions called are those of fla 0.6.0.

Chunk states: `chunk_gla` passes the state from chunk to chunk in one serial walk per (sequence, head, state
tile), forward (`chunk_fwd_kernel_h`) and backward (`chunk_bwd_kernel_dh`). At high resolution the batch is small
and the sequence long (2 images of 16,389 tokens at 2048^2), so a few dozen programs walk hundreds of chunks. From
T = PARALLEL_STATES_MIN_T the chunk mode composes fla's other chunk kernels with the states and their gradients
passed in parallel (`kernels.chunk_states`).

On the CPU, where fla's kernels cannot run, the ops compute the exact torch chunked form (`gla.gla_chunked`), its
gradient by torch.func.vjp: so their registrations (fake tensors, autograd) can be checked there.
"""

from __future__ import annotations

from typing import Any

import torch

from . import chunk_states
from .autograd_ops import Kernel, differentiable
from .host_math import next_power_of_2

MODES = ("chunk", "fused_recurrent")
PARALLEL_STATES_MIN_T = 3072  # H200 sweep (bench_gla.py --states-lengths): loses at 2053 tokens, wins from 4101


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, scale: float) -> torch.Tensor:
    """The exact torch form (imported here: kernels.gla imports this module)."""
    from .gla import TORCH_CHUNK_SIZE, gla_chunked

    return gla_chunked(q, k, v, gk, scale=scale, chunk_size=TORCH_CHUNK_SIZE)[0]


def _reference_backward(q, k, v, gk, do, scale) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv, dgk) of the torch form."""
    _, vjp = torch.func.vjp(lambda *xs: _reference(*xs, scale), q, k, v, gk)
    return tuple(g.contiguous() for g in vjp(do.to(q.dtype)))


def _chunk_size(T: int) -> int:
    """fla's chunk size for a sequence of T (ChunkGLAFunction.forward)."""
    return min(64, max(16, next_power_of_2(T)))


def parallel_states(T: int) -> bool:
    """Whether chunk mode passes states between the chunks of a T-token sequence in parallel (module docstring)."""
    return T >= PARALLEL_STATES_MIN_T


def _log2_cumsum(gk: torch.Tensor, size: int) -> torch.Tensor:
    """Chunk-local cumsum of the log gates in log2 units, as chunk_gla's kernels take them."""
    from fla.ops.utils.constant import RCP_LN2
    from fla.ops.utils.cumsum import chunk_local_cumsum

    return chunk_local_cumsum(gk, size, scale=RCP_LN2)


def _parallel_chunk_forward(q, k, v, gk, scale) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """chunk_gla's forward (chunk_gla_fwd) with the states passed in parallel: (o, A, g_cumsum)."""
    from fla.ops.gla.chunk import chunk_gla_fwd_intra_gk, chunk_gla_fwd_o_gk

    size = _chunk_size(q.shape[1])
    g = _log2_cumsum(gk, size)
    h = chunk_states.states(k, v, g, size, k.dtype)
    A = chunk_gla_fwd_intra_gk(q=q, k=k, g=g, scale=scale, chunk_size=size)
    return chunk_gla_fwd_o_gk(q=q, v=v, g=g, A=A, h=h, scale=scale, chunk_size=size), A, g


def _parallel_chunk_backward(q, k, v, A, g, do, scale) -> tuple[torch.Tensor, ...]:
    """chunk_gla_bwd's steps with the states and their gradients passed in parallel: (dq, dk, dv, dg)."""
    from fla.ops.gla.chunk import chunk_gla_bwd_dA, chunk_gla_bwd_dqk_intra, chunk_gla_bwd_dqkg, chunk_gla_bwd_dv

    size = _chunk_size(q.shape[1])
    h = chunk_states.states(k, v, g, size)
    dh = chunk_states.state_grads(q, do, g, scale, size)
    dv = chunk_gla_bwd_dv(k=k, g=g, A=A, do=do, dh=dh, chunk_size=size)
    dA = chunk_gla_bwd_dA(v=v, do=do, scale=scale, chunk_size=size)
    dq, dk = chunk_gla_bwd_dqk_intra(q=q, k=k, g=g, dA=dA, chunk_size=size)
    dq, dk, dg = chunk_gla_bwd_dqkg(q=q, k=k, v=v, h=h, g=g, do=do, dh=dh, dq=dq, dk=dk, scale=scale, chunk_size=size)
    return dq, dk, dv, dg


def _fla_forward(q, k, v, gk, scale, mode) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o, A, g_cumsum) by fla's kernels (A and g_cumsum empty for fused_recurrent)."""
    from fla.ops.gla import fused_recurrent_gla
    from fla.ops.gla.chunk import chunk_gla_fwd

    with torch.cuda.device(q.device):
        if mode == "chunk" and parallel_states(q.shape[1]):
            o, A, g = _parallel_chunk_forward(q, k, v, gk, scale)
        elif mode == "chunk":
            g, A, _, _, o = chunk_gla_fwd(
                q=q, k=k, v=v, g=gk, g_cumsum=None, scale=scale, initial_state=None, output_final_state=False,
                chunk_size=_chunk_size(q.shape[1]),
            )  # fmt: skip
        else:
            o = fused_recurrent_gla(q, k, v, gk=gk, scale=scale)[0]
            A, g = _nothing_kept(q)
    return o.to(q.dtype), A, g


def _fla_backward(q, k, v, gk, A, g, do, scale, mode) -> tuple[torch.Tensor, ...]:
    with torch.cuda.device(q.device):
        if mode == "chunk" and parallel_states(q.shape[1]):
            dq, dk, dv, dg = _parallel_chunk_backward(q, k, v, A, g, do, scale)
        elif mode == "chunk":
            from fla.ops.gla.chunk import chunk_gla_bwd

            dq, dk, dv, dg, _ = chunk_gla_bwd(
                q=q, k=k, v=v, g=None, g_cumsum=g, scale=scale, initial_state=None, h=None, A=A, do=do, dht=None,
                chunk_size=_chunk_size(q.shape[1]),
            )  # fmt: skip
        else:
            from fla.ops.common.fused_recurrent import fused_recurrent_bwd

            dq, dk, dv, _, dg, _, _ = fused_recurrent_bwd(q=q, k=k, v=v, gk=gk, do=do, scale=scale)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(gk.dtype)


def _nothing_kept(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The A and g_cumsum outputs where nothing is kept: two empty fp32 tensors (outputs may not alias)."""
    return q.new_empty(0, dtype=torch.float), q.new_empty(0, dtype=torch.float)


def _keeps_intermediates(q: torch.Tensor, mode: str) -> bool:
    """Whether the forward returns chunk mode's A and g_cumsum for the backward (fla's chunk kernels on CUDA)."""
    return q.is_cuda and mode == "chunk"


def _forward(q, k, v, gk, scale, mode) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o, A, g_cumsum): the GLA output [B, T, H, V] in q's dtype by fla's kernel for `mode` on CUDA (contiguous
    operands), the torch form on the CPU; chunk mode's intra-chunk scores A [B, T, H, chunk] and log2 gate cumsum
    g_cumsum [B, T, H, K] (fp32, kept for the backward; empty where not `_keeps_intermediates`)."""
    if q.is_cuda:
        return _fla_forward(q, k, v, gk, scale, mode)
    return _reference(q, k, v, gk, scale).contiguous(), *_nothing_kept(q)


def _backward_kernel(q, k, v, gk, A, g, do, scale, mode) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv, dgk): fla's backward kernels for `mode` on CUDA, the torch form's gradient on the CPU."""
    if q.is_cuda:
        return _fla_backward(q, k, v, gk, A, g, do.contiguous(), scale, mode)
    return _reference_backward(q, k, v, gk, do, scale)


@torch.library.custom_op("lkat_lens::fla_gla", mutates_args=())
def _fla_gla_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, scale: float, mode: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward (_forward) as a custom op."""
    return _forward(q, k, v, gk, scale, mode)


@_fla_gla_op.register_fake
def _fla_gla_fake(q, k, v, gk, scale, mode):
    o = q.new_empty(*q.shape[:3], v.shape[-1])
    if not _keeps_intermediates(q, mode):
        return o, *_nothing_kept(q)
    A = q.new_empty(*q.shape[:3], _chunk_size(q.shape[1]), dtype=torch.float)
    return o, A, q.new_empty(q.shape, dtype=torch.float)


@torch.library.custom_op("lkat_lens::fla_gla_backward", mutates_args=())
def _fla_gla_backward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gk: torch.Tensor,
    A: torch.Tensor,
    g: torch.Tensor,
    do: torch.Tensor,
    scale: float,
    mode: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward (_backward_kernel) as a custom op."""
    return _backward_kernel(q, k, v, gk, A, g, do, scale, mode)


@_fla_gla_backward_op.register_fake
def _fla_gla_backward_fake(q, k, v, gk, A, g, do, scale, mode):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), gk.new_empty(gk.shape)


def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    q, k, v, gk, scale, mode = inputs
    _, A, g = output
    ctx.mark_non_differentiable(A, g)
    ctx.save_for_backward(q, k, v, gk, A, g)
    ctx.args = (scale, mode)


def _backward(ctx: Any, do: torch.Tensor, _dA, _dg, kernel) -> tuple[torch.Tensor | None, ...]:
    return (*kernel(*ctx.saved_tensors, do, *ctx.args), None, None)


_fla_gla = differentiable(
    Kernel(_fla_gla_op, _forward), Kernel(_fla_gla_backward_op, _backward_kernel), _backward, _setup_context
)


def fla_gla(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, scale: float, mode: str
) -> torch.Tensor:
    """Differentiable GLA output [B, T, H, V] (q's dtype) by fla's `mode` kernel (on the CPU: the torch form)."""
    if mode not in MODES:
        raise ValueError(f"unknown fla GLA mode {mode!r}; expected one of {MODES}")
    q, k, v, gk = (x.contiguous() for x in (q, k, v, gk))
    return _fla_gla(q, k, v, gk, float(scale), mode)[0]
