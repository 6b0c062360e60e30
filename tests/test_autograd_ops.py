"""kernels.autograd_ops: the eager caller of a custom op (a plain autograd.Function around the function the op runs,
its setup and its backward formula with the backward op's function) gives the op's values and gradients without
dispatching the ops, and torch.compile still sees the op."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity
from torch.utils._python_dispatch import TorchDispatchMode

from lkat_lens.kernels import kan_linear, rbf
from lkat_lens.kernels.autograd_ops import Kernel

GRID = (-2.0, 2.0)


def _values_and_grads(fn, inputs: tuple) -> tuple[tuple[torch.Tensor, ...], object]:
    """((output, gradients of the inputs that require grad), the output's grad_fn) of fn on copies of inputs, for a
    fixed output gradient."""
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t for t in inputs]
    y = fn(*leaves)
    dy = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(0))
    wanted = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
    return (y.detach(), *torch.autograd.grad(y, wanted, dy)), y.grad_fn


CASES = {
    "rbf, x and grid weights": (rbf._rbf_op, rbf._rbf, lambda x, w: (x, w, *GRID, False, torch.float64)),
    "kan fused, all three": (
        kan_linear._kan_fused_op,
        kan_linear._kan_fused,
        lambda x, w: (x, w, torch.randn(3, 6, dtype=torch.float64, requires_grad=True), *GRID),
    ),
    "kan fused, x only (needs_input_grad)": (
        kan_linear._kan_fused_op,
        kan_linear._kan_fused,
        lambda x, w: (x, w.detach(), torch.randn(3, 6, dtype=torch.float64), *GRID),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_eager_caller_matches_the_ops_own_autograd(case: str) -> None:
    op, caller, make = CASES[case]
    torch.manual_seed(0)
    x = (torch.randn(5, 6, dtype=torch.float64) * 1.5).requires_grad_()
    inputs = make(x, torch.randn(1, 4, dtype=torch.float64, requires_grad=True))
    eager, eager_node = _values_and_grads(caller, inputs)
    library, library_node = _values_and_grads(op, inputs)
    assert type(eager_node).__name__.startswith("Eager_") and not type(library_node).__name__.startswith("Eager_")
    assert len(eager) == len(library)
    for a, b in zip(eager, library, strict=True):
        assert torch.equal(a, b)


class _OpNames(TorchDispatchMode):
    """Records the name of every op dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("case", list(CASES))
def test_eager_caller_runs_the_functions_without_dispatching_the_ops(case: str) -> None:
    """The eager forward and backward call the functions behind the ops: no lkat_lens op reaches the dispatcher
    (its host cost is what the eager callers save), while the library's own call dispatches both."""
    op, caller, make = CASES[case]
    x = (torch.randn(5, 6, dtype=torch.float64) * 1.5).requires_grad_()
    inputs = make(x, torch.randn(1, 4, dtype=torch.float64, requires_grad=True))
    seen = {}
    for name, fn in (("eager", caller), ("library", op)):
        with _OpNames() as mode:
            _values_and_grads(fn, inputs)
        seen[name] = [n for n in mode.names if n.startswith("lkat_lens.")]
    assert seen["eager"] == [], seen["eager"]
    assert len(seen["library"]) == 2 and seen["library"][1].split(".")[1].endswith("_backward"), seen["library"]


def test_compiled_caller_keeps_the_op_in_the_graph() -> None:
    """While torch.compile traces, the caller is the op itself: one node of the graph, the same values."""
    x = torch.randn(4, 6) * 1.5
    w = torch.randn(1, 4)
    seen = []

    def backend(gm: torch.fx.GraphModule, example_inputs):
        seen.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm

    compiled = torch.compile(lambda a, b: rbf._rbf(a, b, *GRID, False, torch.float32), backend=backend, fullgraph=True)
    y = compiled(x, w)
    assert any("rbf_grid_linear" in target for target in seen), seen
    torch.testing.assert_close(y, rbf._rbf_op(x, w, *GRID, False, torch.float32), rtol=0, atol=0)


@pytest.mark.parametrize("case", list(CASES))
def test_without_gradients_the_caller_runs_the_function_alone(case: str) -> None:
    """Under no_grad (inference, analyses) the eager caller calls the forward's function: the same output, and no
    autograd.Function runs (none shows in torch.profiler's events, where the graded call shows Eager_<op>)."""
    _, caller, make = CASES[case]
    x = (torch.randn(5, 6, dtype=torch.float64) * 1.5).requires_grad_()
    inputs = make(x, torch.randn(1, 4, dtype=torch.float64, requires_grad=True))
    events = {}
    for grad in (True, False):
        with torch.set_grad_enabled(grad), torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
            y = caller(*inputs)
        events[grad] = (y, {e.name for e in prof.events()})
    (graded, graded_names), (plain, plain_names) = events[True], events[False]
    assert torch.equal(graded.detach(), plain) and plain.grad_fn is None
    assert any(n.startswith("Eager_") for n in graded_names), graded_names
    assert not any(n.startswith("Eager_") for n in plain_names), plain_names


def test_a_kernel_called_runs_its_function_eagerly_and_is_its_op_in_a_compiled_graph() -> None:
    """A Kernel called (as the GLA core calls the short GLA's inside its traced autograd.Function): eagerly its
    function, with no lkat_lens op dispatched; while torch.compile traces, one node of the op; the same values."""
    kernel = Kernel(rbf._rbf_op, rbf._forward)
    x, w = torch.randn(4, 6) * 1.5, torch.randn(1, 4)
    args = (x, w, *GRID, False, torch.float32)
    with _OpNames() as mode:
        eager = kernel(*args)
    assert not [n for n in mode.names if n.startswith("lkat_lens.")], mode.names
    seen = []

    def backend(gm: torch.fx.GraphModule, example_inputs):
        seen.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm

    compiled = torch.compile(lambda a, b: kernel(a, b, *GRID, False, torch.float32), backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(x, w), eager, rtol=0, atol=0)
    assert [target for target in seen if "lkat_lens" in target] == ["lkat_lens.rbf_grid_linear.default"], seen
