"""Token norms: exact norms of cached residuals, token-type split by layout, planted high-norm outliers."""

from __future__ import annotations

import json

import pytest
import torch
from tolerance import assert_close

import lkat_lens
from lkat_lens.analyses.parts import residual_names
from lkat_lens.analyses.tokens import outlier_threshold, token_groups, token_norms

B, IMG = 2, 16
PLANTED = (1, 6)  # image, patch


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(3)
    return lkat_lens.create_model("vit_tiny_patch16_224", num_classes=10, img_size=IMG, patch_size=4, depth=2).eval()


def plant(model, block: int):
    """A hook that scales one patch token of block `block`'s output by 50."""
    patch = model.token_layout["patches"].start + PLANTED[1]

    def scale(x: torch.Tensor, hook) -> torch.Tensor:
        x = x.clone()
        x[PLANTED[0], patch] *= 50
        return x

    return [(f"blocks.{block}.hook_resid_post", scale)]


@pytest.mark.parametrize("name", ["lkat", "vit"])
def test_norms_are_the_norms_of_the_cached_residuals(name, request, images):
    model = request.getfixturevalue(name)
    result = token_norms(model, images)
    _, cache = model.run_with_cache(images, names=residual_names(model))
    want = torch.stack([torch.linalg.norm(cache[n], dim=-1) for n in residual_names(model)])
    assert torch.equal(result.norms, want)
    groups = result.group_norms()
    cls = model.token_layout["cls"].start
    assert cls == {"lkat": 20, "vit": 0}[name]
    assert torch.equal(groups["cls"][..., 0], want[..., cls])
    assert torch.equal(result.patch_maps[:, :, 1, 2], want[..., model.token_layout["patches"].start + 6])
    if name == "lkat":
        assert [f"register_{j}" in groups for j in range(4)] == [True] * 4
        assert torch.equal(groups["register_3"][..., 0], want[..., 19])
    else:
        assert set(groups) == {"patches", "cls"}
    assert not result.outliers.any()
    json.dumps(result.to_dict(), allow_nan=False)


@pytest.mark.parametrize("name", ["lkat", "vit"])
def test_planted_high_norm_patch_is_the_only_outlier(name, request, images):
    model = request.getfixturevalue(name)
    with model.hooks(fwd_hooks=plant(model, 0)):
        result = token_norms(model, images)
    flagged = result.outliers[1].nonzero().tolist()  # depth 1 = output of block 0
    assert flagged == [list(PLANTED)]
    assert not result.outliers[0].any()
    report = result.to_dict()
    assert {"depth": 1, "image": PLANTED[0], "row": 1, "col": 2} in report["outliers"]
    assert report["outlier_fraction"][1] == pytest.approx(1 / (B * 16))


def test_outlier_threshold_known_answer():
    norms = torch.tensor([[1.0, 2.0, 3.0, 4.0, 100.0], [10.0, 10.0, 10.0, 10.0, 11.0]])
    # row 0: median 3, MAD 1 -> max(2*3, 3 + 5*1.4826); row 1: median 10, MAD 0 -> max(20, 10)
    assert_close(outlier_threshold(norms), torch.tensor([3 + 5 * 1.4826, 20.0]))


def test_token_groups_follow_the_layout(lkat, vit):
    assert token_groups(lkat.token_layout) == {
        "patches": slice(0, 16),
        **{f"register_{j}": slice(16 + j, 17 + j) for j in range(4)},
        "cls": slice(20, 21),
    }
    assert token_groups(vit.token_layout) == {"patches": slice(1, 17), "cls": slice(0, 1)}


def test_streamed_in_batches_equals_one_pass(lkat):
    """Issue 15: norms computed in batches of 2 equal one pass (each image's tokens are its own)."""
    images = torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    whole, streamed = token_norms(lkat, images), token_norms(lkat, images, batch_size=2)
    assert_close(streamed.norms, whole.norms)
    assert_close(streamed.thresholds, whole.thresholds)
