"""Our kernels' custom ops with their autograd formula; in eager mode the plain functions behind them are called.

torch.compile needs each kernel as a torch.library custom op: one opaque node with a fake implementation and a
registered backward. In eager mode the op costs host time on every call: first its autograd wrapper (torch.profiler
put its nodes, GeneratedBackwardFor_lkat_lens_*, at about 15 ms of an eager LKAT-T training step's 107 ms of host
time; H200 machine, torch 2.11, batch 128; the step is bound by the host), then its dispatch (the dispatcher, the
library's backend wrapper, dynamo's disable guard) down to the function it wraps: calling those functions directly
took an eager LKAT-T step at batch 8 from 58.7 to 45.8 ms of host time (batch 128: 46.8 to 40.3; scratch ablation on
the H200 machine, medians of three alternating rounds in one process).

So each computation is a `Kernel`: the custom op and the plain function it runs (one that serves every device the op
does). `differentiable` registers the autograd formula on the forward op, for torch.compile, and returns the function
the model calls: the op itself while torch.compile traces, else a plain torch.autograd.Function that runs the
forward's function, the same setup_context and the same backward formula with the backward's function in place of
the backward op, and with gradients off (inference, analyses under no_grad) the forward's function alone: no
autograd node, nothing saved. The paths compute the same values; the tests hold each op to its torch reference.

`traced` skips the custom op: torch.compile traces the same autograd.Function, its host code and its Triton launches
(user-defined kernels that inductor launches itself); the GLA core takes it (kernels/gla_core.py says why). Inside
such a traced function a `Kernel` called is its op while torch.compile traces, so that our autotuner still launches
that op's kernels (the GLA core's short GLA), and its function otherwise. Given a module's `eager_graphs`, a traced
caller replays its eager forward and backward as CUDA graphs (kernels/graphed.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .graphed import GraphedCalls

# The tags of a custom op whose kernels read their tensors through their strides: torch.compile may then pass them in
# whatever layout it holds them; without the tag inductor copies each input to the strides it had when traced (custom
# ops' default).
ANY_STRIDES = (torch.Tag.flexible_layout,)


class Kernel(NamedTuple):
    """One computation as a torch custom op (what torch.compile traces) and as the plain function the op runs (what
    eager mode calls)."""

    op: Any
    function: Callable[..., Any]

    def __call__(self, *args: Any) -> Any:
        """The op while torch.compile traces (one opaque node, whose function launches the kernels), else the
        function (no dispatch); no autograd: for code inside an autograd formula, such as a traced one's."""
        return self.op(*args) if torch.compiler.is_compiling() else self.function(*args)


def _eager_function(
    name: str,
    forward: Callable[..., Any],
    backward_kernel: Callable[..., Any],
    backward: Callable[..., tuple],
    setup_context: Callable[[Any, tuple, Any], None],
) -> type:
    """The torch.autograd.Function that runs `forward`, then setup_context, and backward with `backward_kernel`;
    named Eager_<name> (its backward node Eager_<name>Backward), so profiles and grad_fn tell the ops apart."""

    def eager_forward(ctx: Any, *inputs: Any) -> Any:
        output = forward(*inputs)  # gradients are off inside an autograd.Function's forward
        setup_context(ctx, inputs, output)
        return output

    def eager_backward(ctx: Any, *grads: Any) -> Any:
        return backward(ctx, *grads, kernel=backward_kernel)

    return _function_class(f"Eager_{name}", eager_forward, eager_backward)


def _function_class(name: str, forward: Callable[..., Any], backward: Callable[..., Any]) -> type:
    """A torch.autograd.Function subclass with these forward and backward, named `name`."""
    return type(
        name, (torch.autograd.Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    )


def differentiable(
    forward: Kernel,
    backward_kernel: Kernel,
    backward: Callable[..., tuple],
    setup_context: Callable[[Any, tuple, Any], None],
) -> Callable[..., Any]:
    """Register the autograd formula on forward.op and return its differentiable caller (positional arguments, as
    the op takes them). backward(ctx, *grads, kernel=...) computes the input gradients with `kernel`: the backward op
    when torch.compile traces, its function in eager mode."""
    forward.op.register_autograd(functools.partial(backward, kernel=backward_kernel.op), setup_context=setup_context)
    name = getattr(forward.op, "_name", "op")
    function = _eager_function(name, forward.function, backward_kernel.function, backward, setup_context)

    def call(*inputs: Any) -> Any:
        if torch.compiler.is_compiling():
            return forward.op(*inputs)
        return function.apply(*inputs) if torch.is_grad_enabled() else forward.function(*inputs)

    return call


class EagerGraphs(NamedTuple):
    """One module's CUDA-graph captures of a traced computation: its forward with gradients on (whose saved outputs
    wait for the backward) and off (its first output alone, read at once), and its backward's kernel function."""

    forward: GraphedCalls
    inference: GraphedCalls
    backward: GraphedCalls


def eager_graphs(forward: Callable[..., Any], backward_kernel: Callable[..., Any], moving: int, dz: int) -> EagerGraphs:
    """Empty captures for a module: the forward's input at position `moving` (its activation) and the backward
    kernel's at position `dz` (the output's gradient) move from call to call; every other tensor stays in place."""
    return EagerGraphs(
        GraphedCalls(forward, [moving], read_at_once=False),
        GraphedCalls(forward, [moving], read_at_once=True, keep=1),
        GraphedCalls(backward_kernel, [dz], read_at_once=True),
    )


def _graphed_function(
    name: str,
    forward: Callable[..., Any],
    backward_kernel: Callable[..., Any],
    backward: Callable[..., tuple],
    setup_context: Callable[[Any, tuple, Any], None],
) -> type:
    """The torch.autograd.Function, named Graphed_<name>, whose apply(graphs, *inputs) runs a traced computation's
    forward and backward kernel as the CUDA graphs of `graphs` (an EagerGraphs) once captured. The forward's first
    output is cloned and the rest, what the backward reads, are the capture's own, saved with the capture's copy of
    the moving input; the capture stays claimed until the backward has read them, and a forward that finds it claimed
    (a second forward before the first one's backward) runs uncaptured. The backward kernel's outputs are cloned."""

    def graphed_forward(ctx: Any, graphs: EagerGraphs, *inputs: Any) -> Any:
        capture = graphs.forward.capture_for(inputs)
        ctx.claim = capture.claim() if capture is not None else None
        ctx.capture = None if ctx.claim is None else capture
        if ctx.capture is None:
            output, saved_inputs = forward(*inputs), inputs
        else:
            statics = capture.replay(inputs)
            output, saved_inputs = (statics[0].clone(), *(t.detach() for t in statics[1:])), capture.inputs
            ctx.graphs, ctx.generation = graphs, capture.generation
        setup_context(ctx, saved_inputs, output)
        return output

    def graphed_backward(ctx: Any, *grads: Any) -> Any:
        if ctx.capture is None:
            return None, *backward(ctx, *grads, kernel=backward_kernel)
        if ctx.capture.generation != ctx.generation:
            raise RuntimeError(
                f"{name}: a later forward replayed this layer's CUDA graph and overwrote what this backward reads "
                "(a second backward through a graph kept with retain_graph=True after another forward); set the "
                "model's eager_graphs off (LKAT.set_backends(eager_graphs=False)) for that"
            )
        result = backward(ctx, *grads, kernel=ctx.graphs.backward)
        ctx.claim = None  # read: the next forward may replay
        return None, *result

    return _function_class(f"Graphed_{name}", graphed_forward, graphed_backward)


def traced(
    name: str,
    forward: Callable[..., Any],
    backward_kernel: Callable[..., Any],
    backward: Callable[..., tuple],
    setup_context: Callable[[Any, tuple, Any], None],
) -> Callable[..., Any]:
    """The differentiable caller call(*inputs, graphs=None) of plain functions that torch.compile traces through: no
    custom op; the same autograd.Function in every mode, which dynamo traces with the host code and records each
    Triton launch as a user-defined kernel (tuned.TunedKernel), so inductor launches the kernels from its generated
    code. With gradients off, `forward` alone. Given `graphs` (an EagerGraphs, one per module) and a moving input on
    CUDA outside torch.compile, the forward and backward replay as its CUDA graphs once captured (_graphed_function;
    with gradients off the inference capture, its one output cloned)."""
    function = _eager_function(name, forward, backward_kernel, backward, setup_context)
    graphed_function = _graphed_function(name, forward, backward_kernel, backward, setup_context)

    def call(*inputs: Any, graphs: EagerGraphs | None = None) -> Any:
        if graphs is not None and not torch.compiler.is_compiling() and inputs[min(graphs.forward.moving)].is_cuda:
            return graphed_function.apply(graphs, *inputs) if torch.is_grad_enabled() else graphs.inference(*inputs)
        return function.apply(*inputs) if torch.is_grad_enabled() else forward(*inputs)

    return call
