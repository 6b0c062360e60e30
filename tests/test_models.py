"""LKAT family: construction, parameter counts, registry, token layout, KAN bases."""

import subprocess
import sys

import pytest
import timm
import torch
from tolerance import assert_close

import lkat_lens
from lkat_lens.models import LKAT, KANLayer, RbfKAT, create_model

# Paper table "LKAT variants" (params with a 1000-class head at 224^2).
PAPER_PARAMS_M = {
    "lkat_tiny_patch16_224": 6.25,
    "lkat_small_patch16_224": 23.99,
    "lkat_base_patch16_224": 93.99,
    "lkat_large_patch16_224": 329.47,
}


def count_params(name: str, **kwargs) -> int:
    with torch.device("meta"):
        model = timm.create_model(name, num_classes=1000, **kwargs)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name, paper", PAPER_PARAMS_M.items())
def test_parameter_counts_match_paper(name, paper):
    millions = count_params(name) / 1e6
    assert abs(millions - paper) / paper < 0.005, f"{name}: {millions:.3f} M vs paper {paper} M"


def test_imports_and_no_generic_top_level_names(tmp_path):
    code = (
        "import importlib.util, lkat_lens.models, lkat_lens.kernels, lkat_lens.analyses, lkat_lens.apps\n"
        "assert importlib.util.find_spec('models') is None, 'models importable at top level'\n"
        "assert importlib.util.find_spec('kernels') is None, 'kernels importable at top level'\n"
        "assert importlib.util.find_spec('analyses') is None and importlib.util.find_spec('apps') is None\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_timm_registry_with_keyword_arguments():
    model = timm.create_model(
        "lkat_tiny_patch16_224",
        num_classes=10,
        img_size=32,
        patch_size=8,
        kan_num_grids=6,
        kan_basis="channel",
        kan_gated=True,
    )
    assert isinstance(model, LKAT)
    assert model.num_patches == 16 and model.head.out_features == 10
    fc1 = model.blocks[0].mlp.fc1
    assert fc1.basis == "channel" and fc1.rbf.num_grids == 6 and fc1.gat_resid is not None
    assert fc1.grid_weight.shape == (192, 6)
    logits = model(torch.randn(2, 3, 32, 32))
    assert logits.shape == (2, 10) and torch.isfinite(logits).all()


def test_rbfkat_uses_mhsa_rmsnorm_and_unit_grid():
    model = timm.create_model("rbfkat_tiny_patch16_224", num_classes=5, img_size=32, patch_size=8)
    assert isinstance(model, RbfKAT)
    fc1 = model.blocks[0].mlp.fc1
    assert (fc1.rbf.grid_min, fc1.rbf.grid_max) == (-1.0, 1.0) and fc1.layernorm is not None
    assert "qkv" in dict(model.blocks[0].attn.named_children())
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 5)


def test_create_model_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown model 'lkat_huge'"):
        create_model("lkat_huge", num_classes=10)


def test_class_token_is_last_and_reads_every_patch():
    """Causal GLA: the class token (last) depends on every patch; the first patch does not see the last one."""
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_micro", num_classes=10).eval()
    x = torch.randn(1, 3, 16, 16, requires_grad=True)
    tokens = model.forward_features(x)
    assert tokens.shape == (1, model.num_patches + 4 + 1, 64)
    probe = torch.randn(64)  # a plain sum would vanish through the final LayerNorm
    (grad_cls,) = torch.autograd.grad(tokens[0, -1] @ probe, x)
    assert (grad_cls.abs().sum(dim=(0, 1)).reshape(4, 4, 4, 4).sum(dim=(1, 3)) > 0).all()
    (grad_first,) = torch.autograd.grad(model.forward_features(x)[0, 0] @ probe, x)
    assert grad_first[..., :4, :4].abs().sum() > 0
    assert grad_first[..., 4:, :].abs().sum() == 0  # patch 0 cannot read later rows of patches


@pytest.mark.parametrize("basis", ["shared", "channel", "edge"])
def test_kan_layer_bases_match_their_edge_function_formula(basis):
    torch.manual_seed(0)
    layer = KANLayer(5, 3, num_grids=4, basis=basis).double()
    x = torch.randn(7, 5, dtype=torch.float64)
    centers = torch.linspace(-2, 2, 4, dtype=torch.float64)
    phi = torch.exp(-(((x[..., None] - centers) / (4 / 3)) ** 2))  # [7, 5, 4]
    if basis == "shared":
        curve = phi @ layer.grid_linear.weight[0]  # [7, 5]
        expected = curve @ layer.dim_linear.weight.T
    elif basis == "channel":
        curve = (phi * layer.grid_weight).sum(-1)
        expected = curve @ layer.dim_linear.weight.T
    else:
        w = layer.spline_linear.weight.view(3, 5, 4)
        expected = torch.einsum("npg,qpg->nq", phi, w)
    assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)


def test_kan_layer_optional_branches():
    torch.manual_seed(0)
    layer = KANLayer(4, 2, basis="shared", use_layernorm=True, use_base_update=True, gated=True).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    plain = KANLayer(4, 2, basis="shared").double()
    kept = {"grid_linear", "dim_linear", "rbf"}
    plain.load_state_dict({k: v for k, v in layer.state_dict().items() if k.split(".")[0] in kept})
    gamma = layer.gat_resid(x)
    base = layer.base_linear(torch.nn.functional.silu(x))
    expected = plain(layer.layernorm(x)) + base + gamma * torch.sigmoid(gamma)
    assert_close(layer(x), expected)


def test_bad_kan_basis_is_refused():
    with pytest.raises(ValueError, match="unknown KAN basis"):
        KANLayer(4, 4, basis="spline")


def test_backward_reaches_every_trainable_parameter():
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_micro", num_classes=10)
    model(torch.randn(2, 3, 16, 16)).logsumexp(-1).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing
