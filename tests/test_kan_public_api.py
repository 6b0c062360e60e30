"""What a KAN layer tells analyses (models/kan.py), against its raw weights and its own forward pass."""

from __future__ import annotations

import pytest
import torch
from tolerance import assert_close

from lkat_lens.models.kan import KANLayer


def layer(basis: str, **kwargs) -> KANLayer:
    torch.manual_seed(0)
    return KANLayer(6, 5, num_grids=4, basis=basis, **kwargs).double()


@pytest.mark.parametrize("basis", ["shared", "channel", "edge"])
def test_spline_coefficients_rebuild_the_layer_output(basis):
    """sum_p sum_g c_{q,p,g} phi_g(x_p) is the layer's output; every edge's coefficients equal the row slice's."""
    kan = layer(basis)
    x = torch.randn(7, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    coefficients = kan.spline_coefficients(slice(None))  # [out, in, G]
    want = torch.einsum("qpg,npg->nq", coefficients, kan.basis_values(x))
    with torch.no_grad():
        assert_close(kan(x), want)
    q, p = torch.tensor([0, 4, 2]), torch.tensor([5, 1, 1])
    assert torch.equal(kan.spline_coefficients(q, p), coefficients[q, p])


@pytest.mark.parametrize("basis", ["shared", "channel"])
def test_spline_factors_are_the_raw_weights(basis):
    kan = layer(basis)
    scale, curves = kan.spline_factors()
    raw_curves = kan.grid_linear.weight if basis == "shared" else kan.grid_weight
    assert torch.equal(scale, kan.dim_linear.weight.detach()) and torch.equal(curves, raw_curves.detach())
    assert torch.equal(kan.spline_coefficients(2, 3), scale[2, 3] * curves.expand(6, -1)[3])


def test_the_edge_basis_has_no_factors():
    with pytest.raises(ValueError, match="not factorised"):
        layer("edge").spline_factors()


def test_basis_values_are_gaussians_on_the_grid():
    kan = layer("shared", grid_min=-1.0, grid_max=2.0)
    x = torch.tensor([[-1.0, 0.5, 3.0]], dtype=torch.float64)
    centers = torch.linspace(-1.0, 2.0, 4, dtype=torch.float64)
    want = torch.exp(-(((x.unsqueeze(-1) - centers) / 1.0) ** 2))
    assert_close(kan.basis_values(x), want)


def test_branches_are_the_raw_linear_layers():
    kan = layer("shared", use_base_update=True, gated=True)
    weight, bias = kan.base_weight
    assert torch.equal(weight, kan.base_linear.weight.detach()) and torch.equal(bias, kan.base_linear.bias.detach())
    weight, bias = kan.gate_weight
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    gamma = x @ weight.T + bias
    assert_close(kan.gated_contribution(x), gamma * torch.sigmoid(gamma))
    assert layer("edge").base_weight is None and layer("edge").gate_weight is None
