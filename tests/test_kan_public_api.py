"""What a KAN layer tells analyses (models/kan.py), against plain-torch computations from its raw weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tolerance import assert_close

from lkat_lens.models.kan import KANLayer

BASES = ["shared", "channel", "edge"]
OPTIONS = {
    "plain": {},
    "base": dict(use_base_update=True),
    "gated": dict(gated=True),
    "all": dict(use_layernorm=True, use_base_update=True, gated=True),
}


def layer(basis: str, **kwargs) -> KANLayer:
    """A seeded float64 layer 6 -> 5 with G = 4; a LayerNorm, when present, gets a non-trivial affine map."""
    torch.manual_seed(0)
    kan = KANLayer(6, 5, num_grids=4, basis=basis, **kwargs).double()
    if kan.layernorm is not None:
        with torch.no_grad():
            kan.layernorm.weight.uniform_(0.5, 1.5)
            kan.layernorm.bias.uniform_(-0.5, 0.5)
    return kan


def inputs(seed: int = 1) -> torch.Tensor:
    return 1.5 * torch.randn(7, 6, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def raw_coefficients(kan: KANLayer) -> torch.Tensor:
    """c_{q,p,g} [out, in, G] from the raw parameters: W[q,p] w_g, W[q,p] w_{p,g} or the edge weight."""
    if kan.basis == "edge":
        return kan.spline_linear.weight.detach().view(5, 6, 4)
    curves = kan.grid_linear.weight if kan.basis == "shared" else kan.grid_weight  # [1, G] or [in, G]
    return kan.dim_linear.weight.detach()[:, :, None] * curves.detach()[None]


def gaussians(x: torch.Tensor, grid_min: float, grid_max: float, num_grids: int) -> torch.Tensor:
    """exp(-((x - c_g) / h)^2) [..., G] on the uniform grid, written out."""
    h = (grid_max - grid_min) / (num_grids - 1)
    centers = grid_min + h * torch.arange(num_grids, dtype=torch.float64)
    return torch.exp(-(((x.unsqueeze(-1) - centers) / h) ** 2))


@pytest.mark.parametrize("basis", BASES)
def test_spline_coefficients_are_the_raw_weights(basis):
    kan = layer(basis)
    coefficients = kan.spline_coefficients(slice(None))
    assert coefficients.dtype == torch.float64 and not coefficients.requires_grad
    assert torch.equal(coefficients, raw_coefficients(kan))
    q, p = torch.tensor([0, 4, 2]), torch.tensor([5, 1, 1])
    assert torch.equal(kan.spline_coefficients(q, p), coefficients[q, p])
    assert torch.equal(kan.spline_coefficients(slice(1, 3)), coefficients[1:3])


@pytest.mark.parametrize("basis", ["shared", "channel"])
def test_spline_factors_are_the_raw_weights(basis):
    kan = layer(basis)
    scale, curves = kan.spline_factors()
    raw_curves = kan.grid_linear.weight if basis == "shared" else kan.grid_weight
    assert curves.shape == ((1, 4) if basis == "shared" else (6, 4))
    assert torch.equal(scale, kan.dim_linear.weight.detach()) and torch.equal(curves, raw_curves.detach())


def test_the_edge_basis_has_no_factors():
    with pytest.raises(ValueError, match="not factorised"):
        layer("edge").spline_factors()


def test_grid_and_basis_values_are_gaussians_on_the_grid():
    kan = layer("shared", grid_min=-1.0, grid_max=2.0)
    assert (kan.grid_min, kan.grid_max, kan.num_grids, kan.bandwidth) == (-1.0, 2.0, 4, 1.0)
    assert torch.equal(kan.centers, torch.tensor([-1.0, 0.0, 1.0, 2.0], dtype=torch.float64))
    x = torch.tensor([[-1.0, 0.5, 3.0]], dtype=torch.float64)
    assert_close(kan.basis_values(x), gaussians(x, -1.0, 2.0, 4))
    assert kan.basis_values(x.float()).dtype == torch.float64


def test_branch_weights_are_the_raw_linear_layers():
    kan = layer("shared", use_base_update=True, gated=True)
    weight, bias = kan.base_weight
    assert torch.equal(weight, kan.base_linear.weight.detach()) and torch.equal(bias, kan.base_linear.bias.detach())
    weight, bias = kan.gate_weight
    assert torch.equal(weight, kan.gat_resid.weight.detach()) and torch.equal(bias, kan.gat_resid.bias.detach())
    assert layer("edge").base_weight is None and layer("edge").gate_weight is None


@pytest.mark.parametrize("options", OPTIONS, ids=list(OPTIONS))
@pytest.mark.parametrize("basis", BASES)
def test_branch_outputs_are_the_branches_and_sum_to_the_layer(basis, options):
    """spline = sum_p sum_g c_{q,p,g} phi_g(x_p) on the (LayerNorm-ed) input, base = W_b silu(x) + b, gated =
    gamma sigmoid(gamma): each as written out from the raw weights, and together the layer's output."""
    kan = layer(basis, **OPTIONS[options])
    x = inputs()
    seen = {}
    kan.hook_in.register_forward_hook(lambda module, args, out: seen.update(x_in=out))
    with torch.no_grad():
        y = kan(x)
    ln = kan.layernorm
    x_in = x if ln is None else F.layer_norm(x, (6,), ln.weight.detach(), ln.bias.detach(), ln.eps)
    assert_close(kan.edge_input(x), x_in)
    assert torch.equal(kan.edge_input(x), seen["x_in"])
    want = {"spline": torch.einsum("npg,qpg->nq", gaussians(x_in, -2.0, 2.0, 4), raw_coefficients(kan))}
    if kan.base_linear is not None:
        want["base"] = F.silu(x) @ kan.base_linear.weight.detach().T + kan.base_linear.bias.detach()
    if kan.gat_resid is not None:
        gamma = x @ kan.gat_resid.weight.detach().T + kan.gat_resid.bias.detach()
        want["gated"] = gamma * torch.sigmoid(gamma)
    got = kan.branch_outputs(x)
    assert list(got) == list(want)
    for name, value in want.items():
        assert got[name].dtype == torch.float64
        assert_close(got[name], value, msg=name)
    assert_close(sum(got.values()), y)
    if kan.gat_resid is not None:
        assert torch.equal(kan.gated_contribution(x), got["gated"])
