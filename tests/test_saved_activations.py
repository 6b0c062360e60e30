"""What eager LKAT saves for its backward (issue 19's memory goal): the KAN layer's "torch" and "triton" paths keep x
and the weights, not the basis sum psi (recomputed in the backward), the two layers as one (kan_pair) x, the weights
and the hidden activation, and GLA's log gate keeps its output, not the
gate logits. Each is checked against the plain form it replaces (F.linear after the RBF op; F.logsigmoid), values and
gradients, and by what autograd's saved-tensor hooks see."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tolerance import assert_close

import lkat_lens
from lkat_lens.kernels.kan_linear import kan_linear, kan_linear_reference, kan_pair
from lkat_lens.kernels.log_gate import log_gate
from lkat_lens.kernels.rbf import rbf_grid_linear

GRID = (-2.0, 2.0)


def saved(fn, *inputs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """fn's output and the tensors its forward saved for the backward."""
    kept: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*inputs)
    return out, kept


def plain_kan(x, grid_weight, weight):
    """The form the path had: the RBF op writes psi in the matmul's dtype, F.linear multiplies (and keeps psi)."""
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
    return F.linear(rbf_grid_linear(x, grid_weight, *GRID, backend="torch", out_dtype=dtype), weight)


@pytest.mark.parametrize("grid_shape", [(1, 4), (6, 4)], ids=["shared", "channel"])
def test_kan_torch_path_saves_x_and_weights_and_equals_the_plain_form(grid_shape) -> None:
    gen = torch.Generator().manual_seed(0)
    inputs = (
        torch.randn(3, 7, 6, generator=gen, dtype=torch.float64).mul(1.5).requires_grad_(),
        torch.randn(*grid_shape, generator=gen, dtype=torch.float64).requires_grad_(),
        torch.randn(5, 6, generator=gen, dtype=torch.float64).requires_grad_(),
    )
    y, kept = saved(lambda *t: kan_linear(*t, *GRID, backend="torch"), *inputs)
    assert {t.data_ptr() for t in kept} == {t.data_ptr() for t in inputs}  # x, grid weights, W: no psi
    expected = plain_kan(*inputs)
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    assert_close(y, expected, rtol=1e-13, atol=1e-13)
    for got, want in zip(torch.autograd.grad(y, inputs, dy), torch.autograd.grad(expected, inputs, dy), strict=True):
        assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_kan_torch_path_under_bf16_autocast_rounds_as_the_plain_form() -> None:
    """psi and the matmuls in bf16 as F.linear under autocast: the same output and gradients (to bf16 rounding of
    a few summation-order differences at most)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 32, generator=gen).requires_grad_()
    grid_weight, weight = torch.randn(1, 4, generator=gen).requires_grad_(), torch.randn(16, 32, generator=gen) / 6
    weight.requires_grad_()
    dy = torch.randn(64, 16, generator=gen)
    results = []
    for fn in (lambda *t: kan_linear(*t, *GRID, backend="torch"), plain_kan):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = fn(x, grid_weight, weight)
        results.append([y, *torch.autograd.grad(y, (x, grid_weight, weight), dy.to(y.dtype))])
    assert results[0][0].dtype == torch.bfloat16
    for got, want in zip(*results, strict=True):
        assert got.dtype == want.dtype
        assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_log_gate_saves_its_output_and_differentiates_as_logsigmoid(dtype) -> None:
    """Across the logits' range (sigmoid(-x) from about 1 to e^-80, still a normal fp32 number): value and gradient
    of logsigmoid(x) / 16 to the dtype's rounding, the gradient relative to itself where it is tiny."""
    x = torch.tensor([-100.0, -30.0, -3.0, -0.5, 0.0, 0.5, 3.0, 30.0, 80.0], dtype=dtype).requires_grad_()
    gate, kept = saved(log_gate, x, 16.0)
    assert len(kept) == 1 and torch.equal(kept[0], gate)
    (grad,) = torch.autograd.grad(gate, x, torch.ones_like(gate))
    reference = x.detach().double().requires_grad_()
    expected = F.logsigmoid(reference) / 16
    (expected_grad,) = torch.autograd.grad(expected, reference, torch.ones_like(expected))
    rtol = 1e-14 if dtype == torch.float64 else 2e-6
    assert_close(gate.double(), expected, rtol=rtol, atol=0.0)
    assert_close(grad.double(), expected_grad, rtol=rtol, atol=0.0)


def test_lkat_saves_no_gate_logits() -> None:
    """In an eager lkat_micro training forward no block's gate logits are saved (the log gate keeps the gate)."""
    model = lkat_lens.create_model("lkat_micro", num_classes=10).set_backends(attn="torch", kan="torch")
    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    logits = {}
    hooks = [
        block.attn.gk_proj[1].register_forward_hook(lambda m, i, o, b=b: logits.setdefault(b, o))
        for b, block in enumerate(model.blocks)
    ]
    _, kept = saved(model, images)
    for hook in hooks:
        hook.remove()
    kept_ptrs = {t.data_ptr() for t in kept}
    assert not any(out.data_ptr() in kept_ptrs for out in logits.values())


def test_compiled_kan_torch_path_and_log_gate_trace_without_a_break() -> None:
    """While torch.compile traces (fullgraph, aot_eager), the KAN layer's torch path and the log gate are the plain
    forms (the RBF op and F.linear, F.logsigmoid), with the eager forms' values and gradients."""
    gen = torch.Generator().manual_seed(3)
    inputs = [torch.randn(5, 6, generator=gen), torch.randn(1, 4, generator=gen), torch.randn(3, 6, generator=gen)]

    def step(x, grid_weight, weight):
        return kan_linear(x, grid_weight, weight, *GRID, backend="torch") + log_gate(x[:, :3], 16.0)

    results = []
    for fn in (step, torch.compile(step, backend="aot_eager", fullgraph=True)):
        leaves = [t.clone().requires_grad_() for t in inputs]
        y = fn(*leaves)
        results.append([y.detach(), *torch.autograd.grad(y.square().sum(), leaves)])
    for got, want in zip(*results, strict=True):
        assert_close(got, want)


def test_without_gradients_kan_and_log_gate_give_the_same_values_and_save_nothing() -> None:
    """Under no_grad the KAN layer's torch path and the log gate compute their forward alone: the graded call's
    values, no autograd node and nothing saved."""
    gen = torch.Generator().manual_seed(4)
    x, grid_weight, weight = torch.randn(5, 6, generator=gen), torch.randn(1, 4, generator=gen), torch.randn(3, 6)
    leaves = [t.clone().requires_grad_() for t in (x, grid_weight, weight)]
    for fn in (lambda *t: kan_linear(*t, *GRID, backend="torch"), lambda xx, *_: log_gate(xx, 16.0)):
        graded = fn(*leaves)
        with torch.no_grad():
            plain, kept = saved(fn, *leaves)
        assert graded.grad_fn is not None and plain.grad_fn is None and kept == []
        assert torch.equal(graded.detach(), plain)


@pytest.mark.parametrize("grid_shape", [(1, 4), (6, 4)], ids=["shared", "channel"])
def test_kan_pair_saves_x_weights_and_h_and_equals_two_reference_layers(grid_shape) -> None:
    """kan_pair (the KAN MLP's two layers as one computation, which eager graphs replay) against two exact reference
    layers in a row: values and the gradients of x and all four weights in fp64; saved: x, the weights and the hidden
    activation only."""
    gen = torch.Generator().manual_seed(2)
    hidden_grid = (1, 4) if grid_shape[0] == 1 else (9, 4)
    inputs = (
        torch.randn(3, 7, 6, generator=gen, dtype=torch.float64).mul(1.5).requires_grad_(),
        torch.randn(*grid_shape, generator=gen, dtype=torch.float64).requires_grad_(),
        torch.randn(9, 6, generator=gen, dtype=torch.float64).requires_grad_(),
        torch.randn(*hidden_grid, generator=gen, dtype=torch.float64).requires_grad_(),
        torch.randn(5, 9, generator=gen, dtype=torch.float64).requires_grad_(),
    )
    other = (-1.5, 2.5)

    def pair(x, gw1, w1, gw2, w2):
        return kan_pair(x, (gw1, w1, *GRID), (gw2, w2, *other))

    def reference(x, gw1, w1, gw2, w2):
        return kan_linear_reference(kan_linear_reference(x, gw1, w1, *GRID), gw2, w2, *other)

    y, kept = saved(pair, *inputs)
    assert len(kept) == 6 and {t.data_ptr() for t in kept[:5]} == {t.data_ptr() for t in inputs}
    assert kept[5].shape == (3, 7, 9)  # h
    expected = reference(*inputs)
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    assert_close(y, expected, rtol=1e-12, atol=1e-12)
    for got, want in zip(torch.autograd.grad(y, inputs, dy), torch.autograd.grad(expected, inputs, dy), strict=True):
        assert_close(got, want, rtol=1e-11, atol=1e-11)
