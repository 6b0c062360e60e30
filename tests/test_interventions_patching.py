"""Activation patching and corruptions (issue 17), checked against plain torch forward hooks on the modules."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from tolerance import assert_close
from torch import nn

import lkat_lens
from lkat_lens.analyses.attributions import blurred
from lkat_lens.analyses.interventions import (
    activation_patching,
    corrupt,
    hook_names,
    patch_every_point,
    patch_heads,
    patch_residual,
)
from lkat_lens.models.baselines import attach_hook_points

CLS = 20  # lkat_micro: 16 patches, 4 registers, then the class token


@pytest.fixture(scope="module")
def pair() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(1, 3, 16, 16, generator=g), torch.randn(1, 3, 16, 16, generator=g)


@pytest.fixture(scope="module")
def rbfkat():
    torch.manual_seed(0)
    return lkat_lens.create_model(
        "rbfkat_tiny_patch16_224", num_classes=10, img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2
    ).eval()


def logit_diff(logits: torch.Tensor, target: torch.Tensor, foil: torch.Tensor) -> torch.Tensor:
    return (logits.gather(-1, target[:, None]) - logits.gather(-1, foil[:, None])).mean()


def patched_block_input(model, corrupted, clean, block, position) -> torch.Tensor:
    """Logits of `corrupted` with block `block`'s input at `position` taken from the clean run (plain torch hooks)."""
    seen = {}
    handle = model.blocks[block].register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0].clone()))
    with torch.no_grad():
        model(clean)
    handle.remove()

    def swap(module, args):
        x = args[0].clone()
        x[:, position] = seen["x"][:, position]
        return (x,)

    handle = model.blocks[block].register_forward_pre_hook(swap)
    with torch.no_grad():
        out = model(corrupted)
    handle.remove()
    return out


def patched_head(model, corrupted, clean, block, head) -> torch.Tensor:
    """Logits of `corrupted` with head `head`'s slice of o_proj's input in `block` from the clean run."""
    attn = model.blocks[block].attn
    proj = attn.o_proj if hasattr(attn, "o_proj") else attn.proj
    width = proj.in_features // attn.num_heads
    cols = slice(head * width, (head + 1) * width)
    seen = {}
    handle = proj.register_forward_pre_hook(lambda m, args: seen.setdefault("z", args[0].clone()))
    with torch.no_grad():
        model(clean)
    handle.remove()

    def swap(module, args):
        z = args[0].clone()
        z[..., cols] = seen["z"][..., cols]
        return (z,)

    handle = proj.register_forward_pre_hook(swap)
    with torch.no_grad():
        out = model(corrupted)
    handle.remove()
    return out


def test_patching_clean_into_clean_changes_nothing(lkat, pair):
    clean, _ = pair
    for point, blocks, units in (("resid_pre", [1, 3], [0, CLS]), ("heads", [2], None), ("fc1", [3], [0, 5, 77])):
        result = activation_patching(lkat, clean, clean, point, blocks=blocks, units=units)
        assert_close(result.patched, torch.full_like(result.patched, result.clean_metric), rtol=0, atol=1e-5)
        assert result.clean_metric == result.corrupt_metric
        assert torch.isnan(result.values).all()  # (patched - corrupt) / (clean - corrupt) is 0 / 0


def test_patching_the_last_residual_restores_the_clean_logits(lkat, pair):
    clean, corrupted = pair
    with torch.no_grad():
        want, cache = lkat.run_with_cache(clean, names_filter="blocks.3.hook_resid_post")
        got = lkat.run_with_hooks(
            corrupted, fwd_hooks=[("blocks.3.hook_resid_post", lambda t, h: cache["resid_post", 3])]
        )
    assert torch.equal(got, want)
    result = patch_residual(lkat, clean, corrupted, "resid_post", blocks=[-1], units=[0, 7, 19, CLS])
    assert result.axes == ("block", "position") and result.values.shape == (1, 4) and result.blocks == [3]
    assert_close(result.values[0, -1], torch.tensor(1.0, dtype=torch.float64), rtol=0, atol=1e-5)
    assert_close(result.values[0, :-1], torch.zeros(3, dtype=torch.float64), rtol=0, atol=1e-5)  # head reads cls


def test_residual_patching_matches_plain_torch_hooks_and_hand_normalisation(lkat, pair):
    clean, corrupted = pair
    blocks, positions = [0, 3], [3, 17, CLS]
    result = patch_residual(lkat, clean, corrupted, "resid_pre", blocks=blocks, units=positions)
    with torch.no_grad():
        clean_logits, corrupt_logits = lkat(clean), lkat(corrupted)
    target = clean_logits.argmax(-1)
    foil = corrupt_logits.scatter(-1, target[:, None], float("-inf")).argmax(-1)
    assert torch.equal(result.target, target) and torch.equal(result.foil, foil)
    clean_m, corrupt_m = logit_diff(clean_logits, target, foil), logit_diff(corrupt_logits, target, foil)
    assert_close(torch.tensor([result.clean_metric, result.corrupt_metric]), torch.stack([clean_m, corrupt_m]))
    for (row, block), (col, position) in itertools.product(enumerate(blocks), enumerate(positions)):
        got = logit_diff(patched_block_input(lkat, corrupted, clean, block, position), target, foil)
        assert_close(result.patched[row, col], got.double(), rtol=0, atol=1e-5)
        want = (got - corrupt_m) / (clean_m - corrupt_m)
        assert_close(result.values[row, col], want.double(), rtol=0, atol=1e-4)


@pytest.mark.parametrize("model_name", ["lkat", "rbfkat"])
def test_head_patching_matches_plain_torch_hooks(model_name, request, pair):
    model = request.getfixturevalue(model_name)
    clean, corrupted = pair
    result = patch_heads(model, clean, corrupted, metric="logit", blocks=[0, -1])
    assert result.axes == ("block", "head") and result.metric == "logit" and result.foil is None
    target = result.target
    for row, block in enumerate(result.blocks):
        for head in range(model.blocks[block].attn.num_heads):
            got = patched_head(model, corrupted, clean, block, head).gather(-1, target[:, None]).mean()
            assert_close(result.patched[row, head], got.double(), rtol=0, atol=1e-5)


def test_batched_sweep_equals_one_unit_per_pass(lkat, pair):
    clean, corrupted = pair
    two = torch.cat([clean, corrupted])  # two pairs at once, metric averaged over them
    swapped = torch.cat([corrupted, clean])
    kwargs = dict(blocks=[1], units=[0, 4, 9, 16, 20])
    one = activation_patching(lkat, two, swapped, "resid_mid", rows_per_pass=1, **kwargs)
    for rows in (4, 6):  # 2 and 3 positions per pass, 2 pairs each
        many = activation_patching(lkat, two, swapped, "resid_mid", rows_per_pass=rows, **kwargs)
        assert_close(many.patched, one.patched, rtol=0, atol=1e-5)
    channels = activation_patching(lkat, clean, corrupted, "fc2", units=[1, 2, 30], rows_per_pass=3, blocks=[0])
    singles = [activation_patching(lkat, clean, corrupted, "fc2", units=[u], blocks=[0]).patched for u in (1, 2, 30)]
    assert_close(channels.patched, torch.cat(singles, 1), rtol=0, atol=1e-5)


def test_every_point_has_its_named_axes(lkat, rbfkat, pair):
    clean, _ = pair
    results = patch_every_point(lkat, clean, "blur", blocks=[3], units=[0, 1], rows_per_pass=2)
    assert set(results) == {
        "resid_pre",
        "resid_mid",
        "resid_post",
        "attn_out",
        "heads",
        "q",
        "k",
        "v",
        "gate",
        "fc1",
        "fc2",
    }
    assert results["gate"].axes == ("block", "head") and results["fc1"].axes == ("block", "channel")
    assert results["resid_pre"].layout["cls"] == [CLS] and results["resid_pre"].grid == (4, 4)
    assert results["heads"].to_dict()["axes"] == ["block", "head"]
    assert "gate" not in patch_every_point(rbfkat, clean, "noise", blocks=[0], units=[0])  # softmax: no gates
    torch.manual_seed(0)
    vit5 = lkat_lens.create_model("vit5_micro", num_classes=10).eval()  # no KAN, no gates
    assert set(patch_every_point(vit5, clean, "noise", blocks=[0], units=[0])) == {
        "resid_pre", "resid_mid", "resid_post", "attn_out", "heads", "q", "k", "v"
    }  # fmt: skip


def test_models_without_the_hook_are_refused_by_name(rbfkat, pair):
    clean, corrupted = pair
    with pytest.raises(ValueError, match="no hook point blocks.0.attn.hook_gk .*GLA forget gates"):
        activation_patching(rbfkat, clean, corrupted, "gate")
    torch.manual_seed(0)
    vit = attach_hook_points(
        lkat_lens.create_model(
            "vit_tiny_patch16_224", num_classes=5, img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2
        )
    )
    with pytest.raises(ValueError, match="per-head attention outputs"):
        hook_names(vit, "heads")
    with pytest.raises(ValueError, match="has no hook points"):
        hook_names(nn.Linear(2, 2), "resid_pre")
    with pytest.raises(ValueError, match="unknown hook point"):
        hook_names(rbfkat, "resid")
    with pytest.raises(ValueError, match="'head' needs per-head"):
        activation_patching(rbfkat, clean, corrupted, "resid_pre", "head")
    with pytest.raises(ValueError, match=r"heads \[2\] out of range: blocks.0.attn.hook_z has heads 0..1"):
        activation_patching(rbfkat, clean, corrupted, "heads", units=[1, 2])
    with pytest.raises(ValueError, match="do not pair with clean"):
        activation_patching(rbfkat, clean, torch.cat([corrupted, corrupted]), "resid_pre")


def test_timm_vit_residual_patching_runs_where_the_hooks_exist(pair):
    torch.manual_seed(0)
    vit = lkat_lens.create_model(
        "vit_tiny_patch16_224", num_classes=5, img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2
    ).eval()
    clean, corrupted = pair
    result = patch_residual(vit, clean, corrupted, "resid_post")
    assert_close(result.values[-1, 0], torch.tensor(1.0, dtype=torch.float64), rtol=0, atol=1e-4)  # cls is first


def test_hook_z_is_what_the_output_projection_reads(lkat, rbfkat, images):
    for model in (lkat, rbfkat):
        _, cache = model.run_with_cache(images, names_filter=lambda n: n.startswith("blocks.1.attn."))
        attn = model.blocks[1].attn
        proj = attn.o_proj if hasattr(attn, "o_proj") else attn.proj
        assert_close(proj(cache["blocks.1.attn.hook_z"].flatten(-2)), cache["blocks.1.attn.hook_out"])
    q, k, v = (cache[f"blocks.1.attn.hook_{n}"].transpose(1, 2) for n in "qkv")  # rbfKAT: softmax by hand
    attn = torch.softmax(q @ k.transpose(-1, -2) * rbfkat.blocks[1].attn.scale, -1)
    assert_close(cache["blocks.1.attn.hook_z"], (attn @ v).transpose(1, 2))
    _, cache = lkat.run_with_cache(images, names_filter=lambda n: n.startswith("blocks.1."))
    gla = lkat.blocks[1].attn  # LKAT: each head's GLA output (recurrence by hand), g_norm, times the output gate
    q, k, v, gk = (cache[f"blocks.1.attn.hook_{n}"].double() for n in ("q", "k", "v", "gk"))
    state = torch.zeros(*q.shape[:1], q.shape[2], q.shape[3], v.shape[3], dtype=torch.float64)
    outputs = []
    for t in range(q.shape[1]):
        state = state * gk[:, t, ..., None].exp() + k[:, t, ..., None] * v[:, t, :, None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * gla.scale, state))
    x = lkat.blocks[1].norm1(cache["blocks.1.hook_resid_pre"])
    gate = F.silu(gla.g_proj(x)).unflatten(-1, (gla.num_heads, gla.head_v_dim))
    z = gla.g_norm(torch.stack(outputs, 1).float()) * gate
    assert_close(cache["blocks.1.attn.hook_z"], z, rtol=0, atol=1e-5)


def test_corruptions_are_seeded_and_do_what_they_say(images):
    noisy = corrupt(images, "noise", seed=4)
    assert torch.equal(noisy, corrupt(images, "noise", seed=4)) and not torch.equal(noisy, corrupt(images, "noise"))
    assert abs((noisy - images).std().item() - 1.0) < 0.1
    assert torch.equal(corrupt(images, "blur", sigma=1.5), blurred(images, 1.5))
    shuffled = corrupt(images, "shuffle", patch_size=(4, 4), seed=1)
    tiles = lambda x: F.unfold(x, 4, stride=4).transpose(1, 2)  # noqa: E731  [B, 16 patches, 48]
    original, moved = tiles(images), tiles(shuffled)
    assert not torch.equal(original, moved)
    order = [next(j for j in range(16) if torch.equal(moved[0, i], original[0, j])) for i in range(16)]
    assert sorted(order) == list(range(16))
    assert torch.equal(moved[1], original[1, order])  # one permutation for every image
    other = torch.zeros(3, 16, 16)
    assert torch.equal(corrupt(images, other), torch.zeros_like(images))
    with pytest.raises(ValueError, match="unknown corruption"):
        corrupt(images, "fog")
    with pytest.raises(ValueError, match="needs the model's patch_size"):
        corrupt(images, "shuffle")
