"""Ablations with controls (issue 17): zero, mean, norm-matched noise and resample, each checked against plain
torch forward pre-hooks on the output projection (a head's slice of its input)."""

import pytest
import torch
from tolerance import assert_close

from lkat_lens.analyses.interventions import ABLATIONS, ablate, norm_matched_noise, resample_indices

BLOCK, HEAD = 2, 1


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(2, 3, 16, 16, generator=g), torch.randn(3, 3, 16, 16, generator=g)


def head_inputs(model, images) -> torch.Tensor:
    """o_proj's input [B, T, H*V] in block BLOCK (plain forward pre-hook)."""
    seen = []
    handle = model.blocks[BLOCK].attn.o_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    with torch.no_grad():
        model(images)
    handle.remove()
    return seen[0]


def with_head(model, images, value) -> torch.Tensor:
    """Logits with head HEAD's slice of o_proj's input in block BLOCK replaced by value [B, T, V]."""
    width = model.blocks[BLOCK].attn.head_v_dim
    cols = slice(HEAD * width, (HEAD + 1) * width)

    def swap(module, args):
        z = args[0].clone()
        z[..., cols] = value
        return (z,)

    handle = model.blocks[BLOCK].attn.o_proj.register_forward_pre_hook(swap)
    with torch.no_grad():
        out = model(images)
    handle.remove()
    return out


def metric(logits, target, foil) -> torch.Tensor:
    return (logits.gather(-1, target[:, None]) - logits.gather(-1, foil[:, None])).mean().double()


def test_every_ablation_matches_plain_torch(lkat, batch):
    images, reference = batch
    width = lkat.blocks[BLOCK].attn.head_v_dim
    cols = slice(HEAD * width, (HEAD + 1) * width)
    result = ablate(lkat, images, "heads", reference=reference, blocks=[BLOCK], seed=7)
    assert result.methods == ABLATIONS and result.axes == ("method", "block", "head")
    assert result.ablated.shape == (4, 1, 2) and result.reference_size == 3
    with torch.no_grad():
        logits = lkat(images)
    target = logits.argmax(-1)
    foil = logits.scatter(-1, target[:, None], float("-inf")).argmax(-1)
    assert torch.equal(result.target, target) and torch.equal(result.foil, foil)
    assert_close(torch.tensor(result.clean_metric, dtype=torch.float64), metric(logits, target, foil))
    own, ref = head_inputs(lkat, images)[..., cols], head_inputs(lkat, reference)[..., cols]
    want = {"zero": torch.zeros_like(own), "mean": ref.mean(0, keepdim=True).expand_as(own)}  # resample: below
    for method, value in want.items():
        got = metric(with_head(lkat, images, value), target, foil)
        assert_close(result.ablated[ABLATIONS.index(method), 0, HEAD], got, rtol=0, atol=1e-5)
    assert_close(result.method("zero"), result.ablated[0] - result.clean_metric, rtol=0, atol=1e-12)


def test_resample_takes_another_images_activation(lkat, batch):
    images, reference = batch
    width = lkat.blocks[BLOCK].attn.head_v_dim
    cols = slice(HEAD * width, (HEAD + 1) * width)
    own = head_inputs(lkat, images)[..., cols]
    result = ablate(lkat, images, "heads", methods=("resample",), blocks=[BLOCK])  # reference = the images
    swapped = own.flip(0)  # two images: each is resampled from the other
    got = metric(with_head(lkat, images, swapped), result.target, result.foil)
    assert_close(result.ablated[0, 0, HEAD], got, rtol=0, atol=1e-5)
    one = ablate(lkat, images, "heads", methods=("resample",), reference=reference[:1], blocks=[BLOCK])
    ref = head_inputs(lkat, reference[:1])[..., cols].expand_as(own)
    assert_close(one.ablated[0, 0, HEAD], metric(with_head(lkat, images, ref), one.target, one.foil), atol=1e-5)


def test_resample_indices_never_pick_the_input_itself():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        picks = resample_indices(5, 5, g, same=True)
        assert (picks != torch.arange(5)).all() and ((picks >= 0) & (picks < 5)).all()
    with pytest.raises(ValueError, match="needs another image"):
        resample_indices(1, 1, g, same=True)


def test_noise_is_matched_in_norm_unit_by_unit():
    g = torch.Generator().manual_seed(0)
    activation = torch.randn(3, 7, 4, 5, generator=g) * torch.arange(1, 5).reshape(1, 1, 4, 1)
    for dim in (1, 2, 3):
        noise = norm_matched_noise(activation, dim, torch.Generator().manual_seed(1))
        over = [d for d in (1, 2, 3) if d != dim]
        assert_close(noise.norm(dim=over), activation.norm(dim=over))
        assert not torch.allclose(noise, activation)
    a = norm_matched_noise(activation, 1, torch.Generator().manual_seed(1))
    assert torch.equal(a, norm_matched_noise(activation, 1, torch.Generator().manual_seed(1)))  # seeded
    flat = a.flatten() / a.norm()
    assert abs(torch.dot(flat, activation.flatten() / activation.norm())) < 0.3  # not the activation's direction


def test_noise_ablation_runs_the_noise_it_reports(lkat, batch):
    images, _ = batch
    result = ablate(lkat, images, "resid_pre", methods=("noise",), blocks=[1], units=[4], seed=3)
    _, cache = lkat.run_with_cache(images, names_filter="blocks.1.hook_resid_pre")
    noise = norm_matched_noise(cache["resid_pre", 1], 1, torch.Generator().manual_seed(3))
    assert_close(noise[:, 4].norm(dim=-1), cache["resid_pre", 1][:, 4].norm(dim=-1))

    def swap(module, args):
        x = args[0].clone()
        x[:, 4] = noise[:, 4]
        return (x,)

    handle = lkat.blocks[1].register_forward_pre_hook(swap)
    with torch.no_grad():
        got = metric(lkat(images), result.target, result.foil)
    handle.remove()
    assert_close(result.ablated[0, 0, 0], got, rtol=0, atol=1e-5)


def test_bad_methods_are_refused(lkat, batch):
    images, _ = batch
    with pytest.raises(ValueError, match="unknown ablation methods"):
        ablate(lkat, images, "heads", methods=("erase",))
    with pytest.raises(ValueError, match="needs another image"):
        ablate(lkat, images[:1], "heads", methods=("resample",))
