"""The plain-torch forms that torch.compile traces in place of our custom ops and Conv1d (issue 19): the KAN
layer's "traced" path and GLA's short convolution as shifted multiply-adds. Each is checked against the eager form
it replaces, forward and backward, and a compiled lkat_micro is checked to take them (no opaque KAN op, no conv1d)
with eager's values. The CUDA side is tests/gpu/test_compile_gpu.py."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from tolerance import assert_close

import lkat_lens
from lkat_lens.kernels.kan_linear import TRACED, edge_kan_linear, kan_linear, kan_linear_reference
from lkat_lens.models.attention import ShortConvolution

GRID = (-2.0, 2.0)


def grads(y: torch.Tensor, inputs: tuple[torch.Tensor, ...], dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(y, inputs, dy)


@pytest.mark.parametrize("grid_shape", [(1, 4), (6, 4)], ids=["shared", "channel"])
def test_traced_kan_path_equals_the_reference_and_the_torch_path(grid_shape):
    """fp64, ragged rows: the traced path's output and its gradients in x, the grid weights and W equal autograd
    through the unfused reference, and the torch path's explicit backward."""
    g = torch.Generator().manual_seed(0)
    inputs = (
        torch.randn(3, 7, 6, generator=g, dtype=torch.float64).mul(1.5).requires_grad_(),
        torch.randn(*grid_shape, generator=g, dtype=torch.float64).requires_grad_(),
        torch.randn(5, 6, generator=g, dtype=torch.float64).requires_grad_(),
    )
    traced = kan_linear(*inputs, *GRID, backend=TRACED)
    reference = kan_linear_reference(*inputs, *GRID)
    torch_path = kan_linear(*inputs, *GRID, backend="torch")
    dy = torch.randn(traced.shape, generator=g, dtype=torch.float64)
    assert_close(traced, reference, rtol=1e-12, atol=1e-12)
    assert_close(traced, torch_path, rtol=1e-12, atol=1e-12)
    for got, ref, explicit in zip(
        grads(traced, inputs, dy), grads(reference, inputs, dy), grads(torch_path, inputs, dy), strict=True
    ):
        assert_close(got, ref, rtol=1e-12, atol=1e-12)
        assert_close(got, explicit, rtol=1e-10, atol=1e-10)


def test_traced_kan_path_far_outside_the_grid():
    """fp32 x on the grid and far outside it (where each span's offset is clamped): values and gradients finite and
    within fp32 rounding of the fp64 reference (the clamped Gaussians are below e^-100)."""
    x = torch.tensor([-1e4, -60.0, -12.0, -2.0, -0.7, 0.3, 2.0, 12.0, 60.0, 1e4])[:, None].requires_grad_()
    grid_weight = torch.tensor([[0.5, -1.0, 2.0, 0.25]], requires_grad=True)
    weight = torch.tensor([[1.0], [-3.0]], requires_grad=True)
    inputs = (x, grid_weight, weight)
    traced = kan_linear(*inputs, *GRID, backend=TRACED)
    reference = kan_linear_reference(*(t.double() for t in inputs), *GRID)
    dy = torch.ones_like(traced)
    for got, want in zip(
        (traced, *grads(traced, inputs, dy)), (reference, *grads(reference, inputs, dy.double())), strict=True
    ):
        assert torch.isfinite(got).all()
        assert_close(got.double(), want.detach().double(), rtol=1e-5, atol=1e-6)


def test_traced_kan_path_under_autocast_multiplies_in_bf16():
    """Under bf16 autocast the traced path returns bf16 and agrees with the torch path (same rounding points: psi
    rounded once to bf16, then the matmul)."""
    x, gw, w = torch.randn(4, 9, 6), torch.randn(1, 4), torch.randn(5, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        traced = kan_linear(x, gw, w, *GRID, backend=TRACED)
        torch_path = kan_linear(x, gw, w, *GRID, backend="torch")
    assert traced.dtype == torch_path.dtype == torch.bfloat16
    assert_close(traced.float(), torch_path.float(), rtol=1.6e-2, atol=1e-2)


def test_edge_basis_takes_traced_as_its_torch_path():
    x, w = torch.randn(2, 5, 3), torch.randn(4, 12)
    traced, torch_path = (edge_kan_linear(x, w, *GRID, 4, backend=b) for b in (TRACED, "torch"))
    assert torch.equal(traced, torch_path)


@pytest.mark.parametrize("length", [1, 3, 21])
def test_short_convolution_shifted_taps_equal_conv1d(length):
    """fp32, sequences shorter than, equal to and longer than the taps: values and gradients in x and the weight."""
    torch.manual_seed(length)
    conv = ShortConvolution(12, 4)
    x = torch.randn(2, length, 12, requires_grad=True)
    y_conv, y_taps = conv(x), conv.shifted_taps(x)
    dy = torch.randn_like(y_conv)
    assert_close(y_taps, y_conv)
    for got, want in zip(grads(y_taps, (x, conv.weight), dy), grads(y_conv, (x, conv.weight), dy), strict=True):
        assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_short_convolution_shifted_taps_under_autocast_return_conv1ds_dtype():
    """Under bf16 autocast both forms return bf16 from an fp32 or a bf16 input, equal to bf16 rounding."""
    conv = ShortConvolution(12, 4)
    x = torch.randn(2, 21, 12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_conv, from_fp32, from_bf16 = conv(x.bfloat16()), conv.shifted_taps(x), conv.shifted_taps(x.bfloat16())
    assert y_conv.dtype == from_fp32.dtype == from_bf16.dtype == torch.bfloat16
    assert_close(from_bf16.float(), y_conv.float(), rtol=1.6e-2, atol=1e-2)


def test_compiled_lkat_micro_takes_the_traced_forms_with_eagers_values():
    """torch.compile (fullgraph, aot_eager: the traced graph run by eager kernels) of a training step: the graph
    holds no opaque KAN or RBF op and no conv1d (the traced KAN path and the shifted taps), and the logits and every
    parameter gradient equal the eager model's (kan and attn backends auto, fp32)."""
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_micro", num_classes=10).train()
    for m in model.modules():  # reference init makes KAN outputs ~0; give them weight so they are compared
        if isinstance(m, lkat_lens.models.KANLayer):
            torch.nn.init.normal_(m.grid_linear.weight, std=0.5)
            torch.nn.init.normal_(m.dim_linear.weight, std=m.in_features**-0.5)
    compiled_model = copy.deepcopy(model)
    targets: list[str] = []

    def recording_backend(gm: torch.fx.GraphModule, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    x, labels = torch.randn(2, 3, 16, 16), torch.tensor([1, 7])
    compiled = torch.compile(compiled_model, backend=recording_backend, fullgraph=True)
    runs = {"eager": (model, model), "compiled": (compiled_model, compiled)}
    results = {}
    for name, (owner, run) in runs.items():
        F.cross_entropy(run(x), labels).backward()
        results[name] = (run(x).detach(), [p.grad for p in owner.parameters()])
    torch._dynamo.reset()
    assert targets and not [t for t in targets if "lkat_lens" in t and ("kan" in t or "rbf" in t)], targets
    assert not [t for t in targets if "conv1d" in t], targets
    assert_close(results["compiled"][0], results["eager"][0], rtol=1e-5, atol=1e-6)
    for got, want in zip(results["compiled"][1], results["eager"][1], strict=True):
        assert_close(got, want, rtol=1e-4, atol=1e-5)
