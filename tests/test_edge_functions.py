"""KAN edge functions: curves, symbolic fits, streaming importance, attribution, coverage, diversity, summary."""

import json
import math
import time

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from tolerance import assert_allclose, assert_close

from lkat_lens.analyses.edge_functions import (
    LayerMoments,
    curve_grid,
    edge_curves,
    edge_importance,
    fit_edge,
    kan_attribution,
    layer_statistics,
    shape_diversity,
    summarize_edge_functions,
)
from lkat_lens.analyses.symbolic import LIBRARY, fit_symbolic
from lkat_lens.models import KAN, LKAT, KANLayer

BASES = ("shared", "channel", "edge")


def gaussians(x: np.ndarray, grid_min: float, grid_max: float, num_grids: int) -> np.ndarray:
    """phi_g(x) [P, G] written out in numpy float64."""
    centers = np.linspace(grid_min, grid_max, num_grids)
    h = (grid_max - grid_min) / (num_grids - 1)
    return np.exp(-(((x[:, None] - centers[None, :]) / h) ** 2))


def lstsq_weights(layer: KANLayer, target, num_points: int = 401) -> torch.Tensor:
    """Grid weights [G] whose RBF sum best matches target(x) on [grid_min, grid_max]."""
    rbf = layer.rbf
    x = np.linspace(rbf.grid_min, rbf.grid_max, num_points)
    weights, *_ = np.linalg.lstsq(gaussians(x, rbf.grid_min, rbf.grid_max, rbf.num_grids), target(x), rcond=None)
    return torch.tensor(weights, dtype=torch.float32)


def edge_coefficients(layer: KANLayer) -> np.ndarray:
    """Every edge's coefficient vector [out, in, G] in numpy, straight from the parameters."""
    n_out, n_in, g = layer.out_features, layer.in_features, layer.rbf.num_grids
    if layer.basis == "edge":
        return layer.spline_linear.weight.detach().double().numpy().reshape(n_out, n_in, g)
    w = layer.grid_weights.detach().double().numpy()
    w = np.broadcast_to(w, (n_in, g))
    return layer.dim_linear.weight.detach().double().numpy()[:, :, None] * w[None]


def make_layer(basis: str, n_in: int = 3, n_out: int = 2, seed: int = 0, **kwargs) -> KANLayer:
    torch.manual_seed(seed)
    layer = KANLayer(n_in, n_out, basis=basis, **kwargs)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.5)
    return layer


# ------------------------------------------------------------------------------------------------ curves


@pytest.mark.parametrize("basis", BASES)
def test_edge_curves_equal_the_analytic_rbf_sum(basis):
    layer = make_layer(basis, num_grids=5, grid_min=-1.5, grid_max=2.5, use_base_update=True, gated=True)
    if basis != "edge":
        targets = [np.tanh, np.square, lambda x: np.exp(-x * x)]
        with torch.no_grad():
            if basis == "shared":
                layer.grid_linear.weight.copy_(lstsq_weights(layer, np.tanh))
            else:
                layer.grid_weight.copy_(torch.stack([lstsq_weights(layer, t) for t in targets]))
    curves = edge_curves(layer)
    x = curves.x.numpy()
    h = 1.0
    assert curves.x[0] == pytest.approx(-1.5 - 2 * h) and curves.x[-1] == pytest.approx(2.5 + 2 * h)
    assert curves.edges.tolist() == [[q, p] for q in range(2) for p in range(3)]
    expected = edge_coefficients(layer).reshape(6, 5) @ gaussians(x, -1.5, 2.5, 5).T
    assert_allclose(curves.values.numpy(), expected, rtol=0, atol=1e-6)
    base_w = layer.base_linear.weight.detach().double().numpy().reshape(6)
    silu = x / (1 + np.exp(-x))
    assert_allclose(curves.base_values.numpy(), base_w[:, None] * silu[None], rtol=0, atol=1e-6)
    assert curves.gated is not None and "not edge-separable" in curves.note
    assert curves.gated.weight_norm == pytest.approx(float(layer.gat_resid.weight.detach().double().norm()))
    if basis == "edge":
        assert curves.factor_curves is None and curves.scales is None
    else:
        rows = 1 if basis == "shared" else 3
        assert curves.factor_curves.shape == (rows, x.size)
        factor = curves.factor_curves[curves.edges[:, 1] if basis == "channel" else 0]
        assert_close(curves.scales[:, None] * factor, curves.values, rtol=0, atol=1e-12)
    if basis == "shared":
        assert "one shape" in curves.note


@pytest.mark.parametrize("basis", BASES)
def test_edge_curves_sum_to_the_layer_output(basis):
    layer = make_layer(basis, n_in=3, n_out=4, use_base_update=True)
    x = torch.randn(50, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    total = torch.zeros(50, 4, dtype=torch.float64)
    for p in range(3):
        curves = edge_curves(layer, [(q, p) for q in range(4)], x=x[:, p])
        total += curves.total.T
    total += curves.base_bias
    assert_close(total.float(), layer(x.float()), rtol=1e-5, atol=1e-5)


def test_edge_curves_never_expand_a_large_layer_unasked():
    layer = KANLayer(300, 200, basis="edge")
    with pytest.raises(ValueError, match="pass edges"):
        edge_curves(layer)
    curves = edge_curves(layer, [(199, 299), (0, 0)], num_points=11)
    assert curves.values.shape == (2, 11)
    with pytest.raises(ValueError, match="outside"):
        edge_curves(layer, [(200, 0)])


# ---------------------------------------------------------------------------------------------- symbolic

EXACT = {
    "x": (1.3, 0.4, 2.0, -1.0),
    "x^2": (0.7, 0.5, -1.5, 0.3),
    "x^3": (0.8, -0.3, 0.5, 1.0),
    "x^4": (0.6, 0.2, 0.3, 0.1),
    "exp": (0.9, -0.5, 1.5, -2.0),
    "sin": (1.7, 0.3, 2.0, 0.5),
    "tanh": (1.5, -0.5, -2.0, 1.0),
    "gaussian": (1.2, 0.7, 3.0, -0.5),
    "silu": (2.0, 1.0, 1.0, 0.0),
    "softplus": (1.5, -1.0, 2.0, 0.0),
    "abs": (1.1, -0.55, 1.0, 0.2),
}


@pytest.mark.parametrize("name", EXACT)
def test_symbolic_fit_names_exact_curves(name):
    a, b, c, d = EXACT[name]
    x = torch.linspace(-3, 3, 121, dtype=torch.float64)
    y = c * LIBRARY[name].fn(a * x + b) + d
    result = fit_symbolic(x, y)
    assert result.best.name == name, [(f.name, f.r2) for f in result.ranking[:3]]
    assert result.best.r2 > 0.99999
    assert float((result.best(x) - y).abs().max()) < 1e-3 * float(y.abs().max())
    assert [f.name for f in result.ranking][0] == name and len(result.ranking) == len(LIBRARY)
    json.dumps(result.to_dict(), allow_nan=False)


def test_symbolic_fit_of_a_constant_is_zero():
    x = torch.linspace(-1, 1, 50, dtype=torch.float64)
    result = fit_symbolic(x, torch.full_like(x, 0.7))
    assert result.best.name == "0" and result.best.r2 == 1.0 and result.best.d == pytest.approx(0.7)


@pytest.mark.parametrize(
    "name, target",
    [
        ("tanh", lambda x: 0.8 * np.tanh(1.3 * x - 0.2) + 0.1),
        ("gaussian", lambda x: 1.5 * np.exp(-((x - 0.3) ** 2) / 0.5)),
    ],
)
def test_symbolic_fit_of_a_fitted_rbf_curve(name, target):
    layer = KANLayer(2, 1, basis="channel", num_grids=12, grid_min=-2.0, grid_max=2.0)
    with torch.no_grad():
        layer.grid_weight.copy_(torch.stack([lstsq_weights(layer, target), torch.zeros(12)]))
        layer.dim_linear.weight.copy_(torch.tensor([[2.0, 1.0]]))
    x = torch.linspace(-2, 2, 101, dtype=torch.float64)
    curve = edge_curves(layer, [(0, 0)], x=x).values[0]
    expected = 2 * torch.as_tensor(target(x.numpy()))
    assert float((curve - expected).abs().max()) < 0.05 * float(expected.max() - expected.min())  # an RBF fit only
    result = fit_edge(layer, (0, 0), x=x)
    assert result.best.name == name and result.best.r2 > 0.99


# -------------------------------------------------------------------------------------------- importance


def brute_force_edge_std(layer: KANLayer, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """std over samples of every phi_{q,p}(x_p), computed edge by edge and sample by sample in float64."""
    x64 = x.detach().double()

    def param(t: torch.Tensor) -> torch.Tensor:
        return t.detach().double()

    x_in = x64
    if layer.layernorm is not None:
        ln = layer.layernorm
        x_in = F.layer_norm(x64, ln.normalized_shape, param(ln.weight), param(ln.bias), ln.eps)
    rbf = layer.rbf
    basis = torch.as_tensor(gaussians(x_in.numpy().reshape(-1), rbf.grid_min, rbf.grid_max, rbf.num_grids))
    basis = basis.reshape(*x_in.shape, -1)  # [n, in, G]
    spline = torch.einsum("npg,qpg->nqp", basis, torch.as_tensor(edge_coefficients(layer)))
    out = {"spline": spline.std(0), "total": spline.std(0)}
    if layer.base_linear is not None:
        base = param(layer.base_linear.weight)[None] * F.silu(x64)[:, None, :]
        out |= {"base": base.std(0), "total": (spline + base).std(0)}
    if layer.gat_resid is not None:
        gamma = F.linear(x64, param(layer.gat_resid.weight), param(layer.gat_resid.bias))
        out["gated"] = (gamma * torch.sigmoid(gamma)).std(0)
    return out


ALL_BRANCHES = dict(use_base_update=True, use_layernorm=True, gated=True)


@pytest.mark.parametrize("extras", [{}, ALL_BRANCHES], ids=["plain", "all"])
@pytest.mark.parametrize("basis", BASES)
def test_importance_from_streaming_moments_equals_brute_force(basis, extras):
    layer = make_layer(basis, n_in=5, n_out=3, grid_min=-1.0, grid_max=1.0, **extras)
    x = 0.3 + 0.8 * torch.randn(999, 5, generator=torch.Generator().manual_seed(2))
    x[:, 4] *= 3.0
    stats = layer_statistics(layer, x)["layer"]
    imp = edge_importance(layer, stats)
    ref = brute_force_edge_std(layer, x)
    assert_close(imp.spline_std, ref["spline"], rtol=1e-6, atol=1e-12)
    assert_close(imp.edge_std, ref["total"], rtol=1e-6, atol=1e-12)
    if extras:
        assert_close(imp.base_std, ref["base"], rtol=1e-6, atol=1e-12)
        assert_close(stats.gated_std, ref["gated"], rtol=1e-5, atol=1e-9)
    else:
        assert imp.base_std is None and stats.gated_std is None
    assert_close(stats.output_std, layer(x).double().std(0), rtol=1e-5, atol=1e-7)
    assert stats.count == 999
    # the same statistics when the samples arrive in several uneven batches
    batches = list(x.split([1, 400, 98, 500]))
    streamed = edge_importance(layer, layer_statistics(layer, iter(batches))["layer"])
    assert_close(streamed.edge_std, imp.edge_std, rtol=1e-12, atol=1e-15)
    assert imp.top_edges(1)[0][:2] == tuple(divmod(int(ref["total"].argmax()), 5))
    assert imp.top_inputs(5)[0][0] == int(ref["total"].sum(0).argmax())


def test_importance_is_robust_to_a_large_input_offset():
    layer = make_layer("channel", n_in=2, n_out=2, use_base_update=True)
    x = 1e4 + 1e-2 * torch.randn(500, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    acc = LayerMoments(layer)
    acc.update(x, torch.zeros(500, 2), x_raw=x)
    ref = brute_force_edge_std(layer, x)
    assert_close(edge_importance(layer, acc.statistics()).base_std, ref["base"], rtol=1e-6, atol=0)


def pykan_attribute(importances, eps):
    """pykan's MultKAN.attribute written out: identity output scores, propagated per query, then averaged."""
    node = torch.eye(importances[-1].edge_std.shape[0], dtype=torch.float64)
    nodes, edges = [node], []
    for imp in reversed(importances):
        edge = torch.einsum("ij,ki,i->kij", imp.edge_std, node, 1 / (imp.output_std + eps))
        node = edge.sum(1)
        edges.append(edge)
        nodes.append(node)
    return [n.mean(0) for n in reversed(nodes)], [e.mean(0) for e in reversed(edges)]


@pytest.mark.parametrize("eps", [0.0, 1e-4])
def test_attribution_matches_pykans_recipe(eps):
    torch.manual_seed(4)
    kan = KAN(4, 6, basis="edge", use_base_update=True)
    tokens = torch.randn(3, 40, 4)
    stats = layer_statistics(kan, tokens)
    imps = [edge_importance(kan.fc1, stats["fc1"]), edge_importance(kan.fc2, stats["fc2"])]
    attr = kan_attribution(imps, eps=eps)
    ref_nodes, ref_edges = pykan_attribute(imps, eps)
    for got, ref in zip(attr.node_scores + attr.edge_scores, ref_nodes + ref_edges, strict=True):
        assert_close(got, ref, rtol=1e-12, atol=1e-15)
    assert attr.node_scores[-1].tolist() == [0.25] * 4
    assert attr.top_inputs(1)[0][0] == int(ref_nodes[0].argmax())
    assert attr.top_edges(0, 1)[0][:2] == tuple(divmod(int(ref_edges[0].argmax()), 4))


# ---------------------------------------------------------------------------------------------- coverage


def test_coverage_of_known_inputs():
    layer = KANLayer(2, 1, num_grids=3, grid_min=-1.0, grid_max=1.0)  # h = 1: support [-2, 2], bins over [-3, 3]
    values = torch.tensor([-3.5, -2.5, -1.5, -0.5, 0.5, 0.5, 1.5, 2.5, 2.7, 3.5])
    x = torch.stack([values, torch.zeros(10)], dim=1)
    cov = layer_statistics(layer, x, bins=6)["layer"].coverage
    assert cov.bin_edges.tolist() == [-3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0]
    assert cov.counts.tolist() == [1, 1, 1, 2 + 10, 1, 2]  # the zeros of channel 1 open bin [0, 1)
    assert (cov.underflow, cov.overflow, cov.total) == (1, 1, 20)
    assert cov.support == (-2.0, 2.0)
    assert cov.outside_fraction == pytest.approx(5 / 20)
    assert cov.channel_outside_fraction.tolist() == [0.5, 0.0]


def test_coverage_of_a_normal_sample():
    layer = KANLayer(1, 1, num_grids=4, grid_min=-1.5, grid_max=1.5)  # h = 1: support [-2.5, 2.5]
    x = torch.randn(200_000, 1, generator=torch.Generator().manual_seed(5))
    cov = layer_statistics(layer, x.split(50_000))["layer"].coverage
    expected = math.erfc(2.5 / math.sqrt(2))  # P(|N(0,1)| > 2.5)
    assert abs(cov.outside_fraction - expected) < 0.001
    assert cov.counts.sum() + cov.underflow + cov.overflow == 200_000
    np.testing.assert_array_equal(cov.counts.numpy(), np.histogram(x.numpy(), bins=cov.bin_edges.numpy())[0])


# -------------------------------------------------------------------------------------------- diversity


def brute_force_diversity(layer: KANLayer) -> tuple[float, float]:
    """Effective rank and mean squared correlation from the explicit matrix of normalised curves."""
    rbf = layer.rbf
    phi = gaussians(curve_grid(layer).numpy(), rbf.grid_min, rbf.grid_max, rbf.num_grids)
    coef = edge_coefficients(layer)
    coef = coef.reshape(-1, rbf.num_grids) if layer.basis == "edge" else coef[0]
    curves = coef @ phi.T
    z = curves - curves.mean(1, keepdims=True)
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    sigma = np.linalg.svd(z, compute_uv=False)
    p = sigma[sigma > 1e-12] / sigma.sum()
    corr = z @ z.T
    n = z.shape[0]
    return float(np.exp(-(p * np.log(p)).sum())), float(((corr**2).sum() - n) / (n * (n - 1)))


@pytest.mark.parametrize("basis", ["channel", "edge"])
def test_shape_diversity_equals_brute_force(basis):
    layer = make_layer(basis, n_in=7, n_out=5, num_grids=5)
    div = shape_diversity(layer)
    rank, mean_sq = brute_force_diversity(layer)
    assert div.num_curves == (7 if basis == "channel" else 35) and div.num_flat == 0
    assert div.effective_rank == pytest.approx(rank, rel=1e-9)
    assert div.mean_sq_correlation == pytest.approx(mean_sq, rel=1e-9)
    assert 1.0 < div.effective_rank <= 5.0


def test_shape_diversity_of_one_shape():
    shared = shape_diversity(make_layer("shared", n_in=6, n_out=4))
    assert (shared.num_curves, shared.effective_rank, shared.mean_sq_correlation) == (1, 1.0, 1.0)
    assert "one shape" in shared.note
    layer = make_layer("channel", n_in=4, n_out=3)
    with torch.no_grad():
        layer.grid_weight.copy_(torch.tensor([1.0, -2.0, 0.5, 3.0])[:, None] * torch.tensor([0.3, -1.0, 0.7, 0.2]))
    same = shape_diversity(layer)
    assert same.effective_rank == pytest.approx(1.0, abs=1e-6)
    assert same.mean_sq_correlation == pytest.approx(1.0, abs=1e-9)


# ---------------------------------------------------------------------------------------------- summary


@pytest.fixture(scope="module")
def small_lkat():
    torch.manual_seed(6)
    branches = dict(kan_basis="channel", kan_base_update=True, kan_gated=True, kan_layernorm=True)
    return LKAT(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=3, **branches).eval()


def test_statistics_of_a_model_match_its_cached_activations(small_lkat):
    images = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(7))
    stats = layer_statistics(small_lkat, images.split(3))
    _, cache = small_lkat.run_with_cache(images)
    block = small_lkat.blocks[1]
    raw = block.norm2(cache["blocks.1.hook_resid_mid"]).reshape(-1, 16)
    layer = block.mlp.fc1
    assert_close(layer.layernorm(raw), cache["blocks.1.mlp.fc1.hook_in"].reshape(-1, 16))
    imp = edge_importance(layer, stats["blocks.1.mlp.fc1"])
    ref = brute_force_edge_std(layer, raw)
    assert_close(imp.edge_std, ref["total"], rtol=1e-5, atol=1e-9)
    assert_close(imp.base_std, ref["base"], rtol=1e-5, atol=1e-9)
    out = cache["blocks.1.mlp.fc2.hook_out"].reshape(-1, 16).double()
    assert_close(stats["blocks.1.mlp.fc2"].output_std, out.std(0), rtol=1e-5, atol=1e-9)
    assert stats["blocks.0.mlp.fc2"].count == 4 * 21


def test_summary_of_a_small_lkat(small_lkat):
    images = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(8))
    summary = summarize_edge_functions(small_lkat, images, top_k=3, batch_size=2)
    names = [f"blocks.{i}.mlp.fc{j}" for i in range(2) for j in (1, 2)]
    assert list(summary.layers) == names and list(summary.attributions) == ["blocks.0.mlp", "blocks.1.mlp"]
    assert summary.num_images == 3
    stats = layer_statistics(small_lkat, images)
    for name in names:
        layer = small_lkat.get_submodule(name)
        imp = edge_importance(layer, stats[name])
        got = summary.layers[name]
        assert [e[:2] for e in got.top_edges] == [e[:2] for e in imp.top_edges(3)]
        assert got.top_edges[0][2] == pytest.approx(float(imp.edge_std.max()), rel=1e-9)
        assert got.coverage.total == 3 * 21 * layer.in_features
        assert got.base is not None and got.gated is not None and got.samples == 63
    fc1, fc2 = small_lkat.blocks[0].mlp.fc1, small_lkat.blocks[0].mlp.fc2
    attr = kan_attribution(
        [edge_importance(fc1, stats["blocks.0.mlp.fc1"]), edge_importance(fc2, stats["blocks.0.mlp.fc2"])]
    )
    assert [i for i, _ in summary.attributions["blocks.0.mlp"].top_inputs] == [i for i, _ in attr.top_inputs(3)]
    report = json.loads(json.dumps(summary.to_dict(), allow_nan=False))
    layer_report = report["layers"]["blocks.1.mlp.fc2"]
    assert set(layer_report) >= {"importance", "top_edges", "coverage", "diversity", "base", "gated", "note"}
    assert len(layer_report["coverage"]["counts"]) == 64


@pytest.mark.slow
@pytest.mark.timed
@pytest.mark.usefixtures("default_torch_threads")
def test_lkat_base_summary_is_fast():
    """Under 30 s on this project's CPU machine, with torch's default threads (the suite's trainer fixtures leave
    the process on one thread: 31 s in the suite, 20-24 s with both cores, on 2026-11-27's machine)."""
    torch.manual_seed(0)
    model = timm.create_model("lkat_base_patch16_224").eval()
    images = torch.randn(8, 3, 224, 224)
    start = time.perf_counter()
    summary = summarize_edge_functions(model, images)
    seconds = time.perf_counter() - start
    assert len(summary.layers) == 24 and summary.layers["blocks.11.mlp.fc2"].samples == 8 * 201
    assert seconds < 30, f"edge-function summary of LKAT-B took {seconds:.1f} s"
