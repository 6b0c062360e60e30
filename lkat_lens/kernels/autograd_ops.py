"""Our kernels' custom ops with their autograd formula, called without torch.library's autograd wrapper in eager mode.

torch.compile needs each kernel as a torch.library custom op: one opaque node with a fake implementation and a
registered backward. In eager mode the library's autograd wrapper costs host time on every call: torch.profiler put
its nodes (GeneratedBackwardFor_lkat_lens_*) at about 15 ms of an eager LKAT-T training step's 107 ms of host time
(H200 machine, torch 2.11, batch 128; the step is bound by the host). With the plain Function below, the step took
72.7 ms against 85.0 ms through the library (LKAT-S 73.1 against 78.0, LKAT-B 78.8 against 82.2; medians of three
alternating rounds in one process, `benchmarks/bench_eager_host.py`; the host's timings vary by 10-20 %).

`differentiable` registers the formula on the op, for torch.compile, and returns the function the model calls: the
op itself while torch.compile traces, else a plain torch.autograd.Function around the same pieces (the op's own
call without gradients, which still dispatches to its CPU or CUDA kernel, then the same setup_context and
backward). Both paths compute the same values; the tests hold each op to its torch reference either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def differentiable(
    op: Any, backward: Callable[..., tuple], setup_context: Callable[[Any, tuple, Any], None]
) -> Callable[..., Any]:
    """Register (backward, setup_context) as the custom op's autograd formula and return its differentiable caller
    (positional arguments, as the op takes them)."""
    op.register_autograd(backward, setup_context=setup_context)

    def forward(ctx: Any, *inputs: Any) -> Any:
        output = op(*inputs)  # gradients are off here: the op's call without its autograd wrapper
        setup_context(ctx, inputs, output)
        return output

    # named after the op (its backward node is Eager_<op>Backward), so profiles and grad_fn tell the ops apart
    name = f"Eager_{getattr(op, '_name', 'op')}"
    function = type(
        name, (torch.autograd.Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    )

    def call(*inputs: Any) -> Any:
        return op(*inputs) if torch.compiler.is_compiling() else function.apply(*inputs)

    return call
