"""fla's GLA kernels (`chunk_gla`, `fused_recurrent_gla`) as torch custom ops, so torch.compile keeps them in its graph.

Opaque ops keep inductor out of fla's Triton kernels (recompiling them failed on `fused_recurrent_bwd_kernel`
with torch 2.11 / Triton 3.6, which is why they ran under torch.compiler.disable, a graph break, before).
Each mode is a forward op and a backward op (layout and gates as in `kernels.gla`; outputs in q's dtype,
gradients in their operand's dtype). Only q, k, v and gk are saved. The chunk backward recomputes what fla's own
autograd function keeps from its forward (the chunk-local gate cumsum and the intra-chunk scores A, which fla
calls a marginal cost) and then runs fla's `chunk_gla_bwd`, which recomputes the chunk states as fla's own
backward does. The fused-recurrent backward is fla's `fused_recurrent_bwd` (its saved output is read only for
gv, which GLA has not). The functions called are those of fla 0.6.0.

On the CPU, where fla's kernels cannot run, the ops compute the exact torch chunked form (`gla.gla_chunked`), its
gradient by torch.func.vjp: so their registrations (fake tensors, autograd) can be checked there.
"""

from __future__ import annotations

from typing import Any

import torch

from .autograd_ops import Kernel, differentiable

MODES = ("chunk", "fused_recurrent")


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
    import triton

    return min(64, max(16, triton.next_power_of_2(T)))


def _fla_forward(q, k, v, gk, scale, mode) -> torch.Tensor:
    from fla.ops.gla import chunk_gla, fused_recurrent_gla

    with torch.cuda.device(q.device):
        if mode == "chunk":
            o = chunk_gla(q, k, v, gk, scale=scale)[0]
        else:
            o = fused_recurrent_gla(q, k, v, gk=gk, scale=scale)[0]
    return o.to(q.dtype)


def _fla_backward(q, k, v, gk, do, scale, mode) -> tuple[torch.Tensor, ...]:
    with torch.cuda.device(q.device):
        if mode == "chunk":
            from fla.ops.gla.chunk import chunk_gla_bwd, chunk_gla_fwd_intra_gk
            from fla.ops.utils.constant import RCP_LN2
            from fla.ops.utils.cumsum import chunk_local_cumsum

            size = _chunk_size(q.shape[1])
            g_cumsum = chunk_local_cumsum(gk, size, scale=RCP_LN2)
            A = chunk_gla_fwd_intra_gk(q=q, k=k, g=g_cumsum, scale=scale, chunk_size=size)
            dq, dk, dv, dg, _ = chunk_gla_bwd(
                q=q, k=k, v=v, g=None, g_cumsum=g_cumsum, scale=scale, initial_state=None, h=None, A=A,
                do=do, dht=None, chunk_size=size,
            )  # fmt: skip
        else:
            from fla.ops.common.fused_recurrent import fused_recurrent_bwd

            dq, dk, dv, _, dg, _, _ = fused_recurrent_bwd(q=q, k=k, v=v, gk=gk, do=do, scale=scale)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(gk.dtype)


def _forward(q, k, v, gk, scale, mode) -> torch.Tensor:
    """GLA output [B, T, H, V] in q's dtype: fla's kernel for `mode` on CUDA (contiguous operands), the torch form
    on the CPU."""
    return _fla_forward(q, k, v, gk, scale, mode) if q.is_cuda else _reference(q, k, v, gk, scale).contiguous()


def _backward_kernel(q, k, v, gk, do, scale, mode) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv, dgk): fla's backward kernels for `mode` on CUDA, the torch form's gradient on the CPU."""
    if q.is_cuda:
        return _fla_backward(q, k, v, gk, do.contiguous(), scale, mode)
    return _reference_backward(q, k, v, gk, do, scale)


@torch.library.custom_op("lkat_lens::fla_gla", mutates_args=())
def _fla_gla_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, scale: float, mode: str
) -> torch.Tensor:
    """The forward (_forward) as a custom op."""
    return _forward(q, k, v, gk, scale, mode)


@_fla_gla_op.register_fake
def _fla_gla_fake(q, k, v, gk, scale, mode):
    return q.new_empty(*q.shape[:3], v.shape[-1])


@torch.library.custom_op("lkat_lens::fla_gla_backward", mutates_args=())
def _fla_gla_backward_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, do: torch.Tensor, scale: float, mode: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward (_backward_kernel) as a custom op."""
    return _backward_kernel(q, k, v, gk, do, scale, mode)


@_fla_gla_backward_op.register_fake
def _fla_gla_backward_fake(q, k, v, gk, do, scale, mode):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), gk.new_empty(gk.shape)


def _setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    q, k, v, gk, scale, mode = inputs
    ctx.save_for_backward(q, k, v, gk)
    ctx.args = (scale, mode)


def _backward(ctx: Any, do: torch.Tensor, kernel) -> tuple[torch.Tensor | None, ...]:
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
    return _fla_gla(q, k, v, gk, float(scale), mode)
