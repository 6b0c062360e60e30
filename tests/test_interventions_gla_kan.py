"""GLA gate clamps and state cuts against a hand-written recurrence; KAN edge ablations, pruning and swaps against a
plain torch recomputation of the layer from its raw weights; sweeps against one-at-a-time runs."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F
from tolerance import assert_close

from lkat_lens.analyses.edge_functions import fit_edge
from lkat_lens.analyses.interventions import edges as edges_module
from lkat_lens.analyses.interventions.edges import (
    EdgeAblation,
    EdgeSwap,
    edge_contributions,
    layer_importance,
    prune_masks,
    prune_sweep,
    symbolic_swap,
)
from lkat_lens.analyses.interventions.effects import attached, intervened_logits, measure
from lkat_lens.analyses.interventions.gates import GateClamp, StateCut, gate_clamp_sweep, state_cut_sweep, token_names
from lkat_lens.analyses.parts import kan_layers
from lkat_lens.figures.interventions_gla_kan import (
    gate_clamp_figure,
    prune_curve_figure,
    state_cut_figure,
    symbolic_swap_figure,
)
from lkat_lens.models.kan import KANLayer

BLOCK = 1


def labels_for(images: torch.Tensor) -> torch.Tensor:
    """Fixed labels for the test images (any classes: accuracy and logit changes are measured against them)."""
    return torch.arange(images.shape[0]) % 10


def capture_block(model, images, interventions=()):
    """Block BLOCK's attention input x, q, k, v and gk (before any intervention) and its output (after)."""
    attn = model.blocks[BLOCK].attn
    seen = {}
    handles = [attn.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0]))]
    for name in ("q", "k", "v", "gk"):
        point = getattr(attn, f"hook_{name}")
        handles.append(point.register_forward_hook(lambda m, a, out, name=name: seen.__setitem__(name, out)))
    try:
        with torch.no_grad(), attached(model, list(interventions)):
            out_hook = attn.hook_out.register_forward_hook(lambda m, a, out: seen.__setitem__("out", out))
            model(images)
            out_hook.remove()
    finally:
        for handle in handles:
            handle.remove()
    return seen


def recurrence(q, k, v, alpha, scale, cut: int | None = None) -> torch.Tensor:
    """S_t = diag(α_t) S_{t-1} + k_t v_tᵀ (S reset to 0 before token `cut`), o_t = scale q_tᵀ S_t; float64."""
    q, k, v, alpha = (t.double() for t in (q, k, v, alpha))
    B, T, H, K = q.shape
    state = q.new_zeros(B, H, K, v.shape[-1])
    outs = []
    for t in range(T):
        if t == cut:
            state = torch.zeros_like(state)
        state = alpha[:, t, :, :, None] * state + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outs, dim=1)


def block_output(attn, x, o) -> torch.Tensor:
    """The GLA layer's output from its mixed values o [B,T,H,V]: output gate, g_norm and o_proj (the model's own)."""
    with torch.no_grad():
        return attn.o_proj(attn.g_norm(o.float()).flatten(-2) * F.silu(attn.g_proj(x)))


@pytest.mark.parametrize(
    ("head", "channel", "alpha"), [(0, None, 1.0), (None, None, 1.0), (1, None, 0.0), (0, 5, 0.0), (1, 3, 0.5)]
)
def test_gate_clamp_equals_the_recurrence_with_that_gate(lkat, images, head, channel, alpha):
    seen = capture_block(lkat, images, [GateClamp(BLOCK, head, channel, alpha)])
    gates = seen["gk"].double().exp()
    gates[:, :, slice(None) if head is None else head, slice(None) if channel is None else channel] = alpha
    attn = lkat.blocks[BLOCK].attn
    want = block_output(attn, seen["x"], recurrence(seen["q"], seen["k"], seen["v"], gates, attn.scale))
    assert_close(seen["out"], want, atol=1e-5, rtol=1e-5)
    clean = capture_block(lkat, images)["out"]
    assert (seen["out"] - clean).abs().max() > 1e-3  # the clamp changed the block


def test_state_cut_equals_the_recurrence_with_its_state_reset(lkat, images):
    position = 7
    seen = capture_block(lkat, images, [StateCut(BLOCK, position, through_convs=False)])
    attn = lkat.blocks[BLOCK].attn
    o = recurrence(seen["q"], seen["k"], seen["v"], seen["gk"].exp(), attn.scale, cut=position)
    assert_close(seen["out"], block_output(attn, seen["x"], o), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head", [None, 1])
def test_state_cut_through_convs_hides_every_earlier_token(lkat, images, head):
    attn, position = lkat.blocks[BLOCK].attn, 9
    x = torch.randn(2, 21, 64, generator=torch.Generator().manual_seed(3))
    changed = x.clone()
    changed[:, :position] += torch.randn(2, position, 64, generator=torch.Generator().manual_seed(4))
    cut = StateCut(BLOCK, position, head)
    with torch.no_grad():
        before, after = attn(x), attn(changed)
        with attached(lkat, [cut]):
            cut_before, cut_after = attn(x), attn(changed)
    assert (before[:, position:] - after[:, position:]).abs().max() > 1e-2  # earlier tokens matter uncut
    if head is None:
        assert_close(cut_after[:, position:], cut_before[:, position:], atol=1e-6, rtol=1e-6)
    else:  # the other head still reads the earlier tokens
        assert (cut_after[:, position:] - cut_before[:, position:]).abs().max() > 1e-3
    assert_close(cut_before[:, :position], before[:, :position], atol=1e-6, rtol=1e-6)


def test_gate_clamp_sweep_agrees_with_one_at_a_time_runs(lkat, images):
    labels = labels_for(images)
    sweep = gate_clamp_sweep(lkat, images, labels, alphas=(1.0, 0.0), blocks=[1, 2], batch_size=5)
    clean = intervened_logits(lkat, images).double()
    picked = labels[:, None]
    for a, alpha in enumerate(sweep.alphas):
        for i, block in enumerate(sweep.blocks):
            for head in (0, 1, None):
                logits = intervened_logits(lkat, images, GateClamp(block, head, alpha=alpha)).double()
                change = float((logits.gather(1, picked) - clean.gather(1, picked)).mean())
                accuracy = 100.0 * float((logits.argmax(-1) == labels).double().mean())
                got = sweep.block_logit_change[a, i] if head is None else sweep.head_logit_change[a, i, head]
                got_acc = sweep.block_accuracy_change[a, i] if head is None else sweep.head_accuracy_change[a, i, head]
                assert float(got) == pytest.approx(change, abs=1e-4 * max(1.0, abs(change)))
                assert float(got_acc) == pytest.approx(accuracy - sweep.clean_accuracy, abs=1e-9)
    assert sweep.head_logit_change.shape == (2, 2, 2)
    assert sweep.head_logit_change.abs().max() > 1e-4
    json.dumps(sweep.to_dict())
    fig = gate_clamp_figure(sweep)  # per α: [block x head] and the all-heads column
    assert [list(t.x) for t in fig.data] == [["0", "1", "all"]] * 2
    assert fig.data[1].z[1][2] == pytest.approx(float(sweep.block_logit_change[1, 1]))


def test_state_cut_sweep_names_positions_and_agrees_with_single_cuts(lkat, images):
    labels = labels_for(images)
    names = ["patch 15", "register 0", "register 1", "register 2", "register 3", "cls"]
    assert token_names(lkat.token_layout)[15:] == names
    sweep = state_cut_sweep(lkat, images, labels, positions=[4, 20], blocks=[0, 3], batch_size=4)
    assert sweep.position_names == ["patch 4", "cls"]
    assert list(state_cut_figure(sweep).data[0].x) == ["patch 4", "cls"]
    single = measure(lkat, images, labels, [StateCut(3, 20)])
    assert float(sweep.logit_change[1, 1]) == pytest.approx(float(single.logit_change[0]), abs=1e-5)
    with pytest.raises(ValueError, match="position 21 is out of range"):
        state_cut_sweep(lkat, images, labels, positions=[21])
    with pytest.raises(ValueError, match="no GLA forget gate"):
        measure(lkat, images, labels, [GateClamp(7)])


# ------------------------------------------------------------------------------------------------------ KAN


def kan_layer(basis: str) -> KANLayer:
    """A small seeded KAN layer with a LayerNorm and a SiLU base branch (its edges have two parts)."""
    torch.manual_seed(5)
    layer = KANLayer(6, 5, num_grids=5, basis=basis, use_layernorm=True, use_base_update=True).eval()
    layer.kernel_backend = "torch"
    return layer


def by_hand(layer: KANLayer, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The layer recomputed from its raw weights with only the edges in `keep` [out, in]: float64."""
    x = x.double()
    xn = F.layer_norm(x, (x.shape[-1],), layer.layernorm.weight.double(), layer.layernorm.bias.double())
    centers = torch.linspace(layer.grid_min, layer.grid_max, layer.num_grids, dtype=torch.float64)
    h = (layer.grid_max - layer.grid_min) / (layer.num_grids - 1)
    phi = torch.exp(-(((xn[..., None] - centers) / h) ** 2))  # [..., in, G]
    if layer.basis == "edge":
        coefficients = layer.spline_linear.weight.double().view(layer.out_features, layer.in_features, -1)
    else:
        curve = layer.grid_linear.weight.double() if layer.basis == "shared" else layer.grid_weight.double()
        coefficients = layer.dim_linear.weight.double()[..., None] * curve.expand(layer.in_features, -1)
    spline = torch.einsum("...pg,qpg->...q", phi, coefficients * keep[..., None])
    base = F.silu(x) @ (layer.base_linear.weight.double() * keep).T + layer.base_linear.bias.double()
    return spline + base


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return 1.5 * torch.randn(3, 7, 6, generator=torch.Generator().manual_seed(6))


@pytest.mark.parametrize("basis", ["shared", "channel", "edge"])
def test_edge_ablation_equals_the_layer_without_those_edges(basis, tokens):
    layer = kan_layer(basis)
    keep = torch.ones(5, 6, dtype=torch.bool)
    assert_close(layer(tokens).double(), by_hand(layer, tokens, keep), atol=1e-5, rtol=1e-5)
    cases = [
        (EdgeAblation.edges(layer, "layer", [(0, 1), (3, 4), (3, 5)]), [(0, 1), (3, 4), (3, 5)]),
        (EdgeAblation.input_channel(layer, "layer", 2), [(q, 2) for q in range(5)]),
        (EdgeAblation.output_node(layer, "layer", 4), [(4, p) for p in range(6)]),
    ]
    for ablation, removed in cases:
        keep = torch.ones(5, 6, dtype=torch.bool)
        keep[tuple(zip(*removed, strict=True))] = False
        with torch.no_grad(), attached(layer, [ablation]):
            got = layer(tokens)
        assert_close(got.double(), by_hand(layer, tokens, keep), atol=1e-5, rtol=1e-5)
        assert (got.double() - by_hand(layer, tokens, torch.ones_like(keep))).abs().max() > 1e-3


def test_ablation_on_some_rows_leaves_the_others(tokens):
    layer = kan_layer("channel")
    with torch.no_grad():
        clean = layer(tokens)
        with attached(layer, [EdgeAblation.input_channel(layer, "layer", 0)], rows=slice(1, 2)):
            got = layer(tokens)
    assert torch.equal(got[[0, 2]], clean[[0, 2]])
    assert (got[1] - clean[1]).abs().max() > 1e-3


def exact_curve(layer: KANLayer, edge: tuple[int, int]):
    """φ_{q,p} of the (channel-basis) layer from its raw weights, as a float64 function of the layer input."""
    q, p = edge
    centers = torch.linspace(layer.grid_min, layer.grid_max, layer.num_grids, dtype=torch.float64)
    h = (layer.grid_max - layer.grid_min) / (layer.num_grids - 1)
    scale = layer.dim_linear.weight[q, p].double()
    weights = layer.grid_weight[p].double()
    return lambda x: scale * (torch.exp(-(((x[..., None] - centers) / h) ** 2)) * weights).sum(-1)


def test_swap_with_the_exact_curve_changes_nothing_and_a_zero_curve_ablates_the_spline(tokens):
    layer = kan_layer("channel")
    edges = [(0, 1), (2, 3), (4, 0)]
    with torch.no_grad():
        clean = layer(tokens)
        with attached(layer, [EdgeSwap("layer", {e: exact_curve(layer, e) for e in edges})]):
            swapped = layer(tokens)
        with attached(layer, [EdgeSwap("layer", {e: torch.zeros_like for e in edges})]):
            zeroed = layer(tokens)
    assert_close(swapped, clean, atol=2e-6, rtol=2e-6)
    keep = torch.ones(5, 6, dtype=torch.bool)
    keep[[0, 2, 4], [1, 3, 0]] = False
    base_kept = by_hand(layer, tokens, keep) + F.silu(tokens.double()) @ (layer.base_linear.weight.double() * ~keep).T
    assert_close(zeroed.double(), base_kept, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def strong_kan(lkat):
    """lkat_micro with its KAN coefficients multiplied by 900, so that its edges move the logits visibly (at their
    initial scale the KAN layers barely do)."""
    model = copy.deepcopy(lkat)
    with torch.no_grad():
        for layer in kan_layers(model).values():
            layer.dim_linear.weight.mul_(30.0)
            layer.grid_linear.weight.mul_(30.0)
    return model


def test_pruning_with_threshold_zero_changes_nothing(strong_kan, images):
    lkat, labels = strong_kan, labels_for(images)
    importance = layer_importance(lkat, images, ["blocks.0.mlp.fc1", "blocks.2.mlp.fc2"])
    masks = prune_masks(importance, 0.0)
    assert not any(mask.any() for mask in masks.values())
    ablations = [EdgeAblation(name, mask) for name, mask in masks.items()]
    assert torch.equal(intervened_logits(lkat, images, *ablations), intervened_logits(lkat, images))
    curve = prune_sweep(lkat, images, labels, (0.0, 0.5, 2.0), list(importance), importance, batch_size=2)
    assert curve.fraction_pruned[0] == 0 and curve.fraction_pruned[2] == 1
    assert 0 < curve.fraction_pruned[1] < 1
    assert curve.logit_change[0] == pytest.approx(0.0, abs=1e-5) and curve.accuracy_change[0] == 0
    half = [EdgeAblation(name, mask) for name, mask in prune_masks(importance, 0.5).items()]
    single = measure(lkat, images, labels, [half])
    assert float(curve.logit_change[1]) == pytest.approx(float(single.logit_change[0]), abs=1e-5)
    assert curve.logit_abs_change[0] == 0 and curve.logit_abs_change[2] > 1e-4
    json.dumps(curve.to_dict())
    assert list(prune_curve_figure(curve).data[0].x) == curve.fraction_pruned.tolist()


def test_symbolic_swap_reports_fits_and_agrees_with_single_swaps(strong_kan, images):
    lkat, labels = strong_kan, labels_for(images)
    name = "blocks.1.mlp.fc2"
    found = symbolic_swap(lkat, images, labels, name, k=2, library=["x", "x^2"], batch_size=4)
    assert len(found.edges) == 2 and found.importance[0] >= found.importance[1]
    assert all(0 <= r2 <= 1 for r2 in found.r2) and all(isinstance(f, str) for f in found.formulas)
    layer = dict(lkat.named_modules())[name]
    fit = fit_edge(layer, found.edges[0], library=["x", "x^2"]).best
    single = measure(lkat, images, labels, [EdgeSwap(name, {found.edges[0]: fit})])
    assert float(found.edge_logit_change[0]) == pytest.approx(float(single.logit_change[0]), abs=1e-5)
    assert found.logit_abs_change >= 0 and math.isfinite(found.logit_change)
    json.dumps(found.to_dict())
    table = symbolic_swap_figure(found).data[0].cells.values
    assert list(table[0]) == [f"φ[{q},{p}]" for q, p in found.edges] + ["all together"]
    assert list(table[2][:2]) == found.formulas


def test_edge_contributions_in_small_chunks_equal_one_pass(tokens, monkeypatch):
    layer = kan_layer("edge")
    mask = torch.rand(5, 6, generator=torch.Generator().manual_seed(7)) < 0.5
    whole = edge_contributions(layer, mask, tokens)
    monkeypatch.setattr(edges_module, "CHUNK_ELEMENTS", 7)  # a few tokens per chunk
    assert_close(edge_contributions(layer, mask, tokens), whole, atol=1e-13, rtol=1e-13)
    keep = ~mask
    clean = by_hand(layer, tokens, torch.ones_like(mask))
    assert_close(clean - whole, by_hand(layer, tokens, keep), atol=1e-6, rtol=1e-6)  # the layer's fp32 LayerNorm
