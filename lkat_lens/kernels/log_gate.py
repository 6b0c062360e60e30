"""GLA's log forget gate logsigmoid(x) / n, differentiated from its output instead of its input.

F.logsigmoid saves its input for the backward: in an eager LKAT block that is the fp32 gate logits [B, T, K], kept
beside the gate itself, which the GLA saves anyway. d/dx logsigmoid(x) = sigmoid(-x) = -expm1(logsigmoid(x)), so the
gradient follows from the output alone (expm1 keeps it exact where sigmoid(-x) is tiny); `log_gate` saves only the
output. While torch.compile traces, it is the plain ops (inductor decides what the compiled backward saves), and so it
is with gradients off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _LogGate(torch.autograd.Function):
    """logsigmoid(x) / n, saving the output only."""

    @staticmethod
    def forward(x: torch.Tensor, normalizer: float) -> torch.Tensor:
        return F.logsigmoid(x) / normalizer

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
        ctx.save_for_backward(output)
        ctx.normalizer = inputs[1]

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        """grad * sigmoid(-x) / n = grad * -expm1(n * gate) / n, in three kernels (as few as torch's ops allow: the
        plain form's backward is two)."""
        (gate,) = ctx.saved_tensors
        decay = torch.expm1(gate * ctx.normalizer)
        return torch.addcmul(decay.new_zeros(()), decay, grad, value=-1.0 / ctx.normalizer), None


def log_gate(x: torch.Tensor, normalizer: float) -> torch.Tensor:
    """logsigmoid(x) / normalizer, in x's dtype; its backward needs only the output (see the module docstring)."""
    if torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return F.logsigmoid(x) / normalizer
    return _LogGate.apply(x, float(normalizer))
