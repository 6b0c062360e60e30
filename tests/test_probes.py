"""Linear probes: features by token layout (cls last for LKAT, first for timm ViT), planted signal, held-out scoring."""

import json

import numpy as np
import pytest
import torch
from timm.models.mlp_mixer import MlpMixer
from tolerance import assert_allclose, assert_close

import lkat_lens
from lkat_lens.analyses.parts import residual_names
from lkat_lens.analyses.probes import (
    collect_features,
    feature_kinds,
    fit_probe,
    linear_probes,
    token_features,
)
from lkat_lens.models.baselines import attach_hook_points

IMG, PATCH, N_PATCH, D, DEPTH = 16, 4, 16, 64, 4


@pytest.fixture(scope="module")
def lkat():
    torch.manual_seed(0)
    return lkat_lens.create_model("lkat_micro", num_classes=10).eval()


def half_bright_images(labels: torch.Tensor, seed: int, amplitude: float = 2.0) -> torch.Tensor:
    """Noise images whose left half (label 0) or right half (label 1) is brighter by `amplitude`."""
    x = torch.randn(len(labels), 3, IMG, IMG, generator=torch.Generator().manual_seed(seed))
    x[:, :, :, : IMG // 2] += amplitude * (labels == 0).float()[:, None, None, None]
    x[:, :, :, IMG // 2 :] += amplitude * (labels == 1).float()[:, None, None, None]
    return x


def shuffled_labels(zeros: int, ones: int, seed: int) -> torch.Tensor:
    """`zeros` labels 0 and `ones` labels 1 in a seeded random order."""
    labels = torch.cat([torch.zeros(zeros, dtype=torch.long), torch.ones(ones, dtype=torch.long)])
    return labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))]


def test_probe_reaches_full_accuracy_on_a_planted_signal_and_chance_on_noise():
    rng = np.random.default_rng(0)
    means = 4.0 * np.eye(3, 20)  # three classes, each shifted along its own direction
    y_train, y_test = rng.integers(0, 3, 300), rng.integers(0, 3, 300)
    x_train = rng.normal(size=(300, 20)) + means[y_train]
    x_test = rng.normal(size=(300, 20)) + means[y_test]
    train_acc, test_acc = fit_probe(x_train, y_train, x_test, y_test)
    assert train_acc >= 0.97 and test_acc >= 0.95
    _, noise_acc = fit_probe(rng.normal(size=(300, 20)), y_train, rng.normal(size=(300, 20)), y_test)
    assert abs(noise_acc - 1 / 3) < 0.1


def test_lkat_features_read_the_last_token_as_cls(lkat):
    images = torch.randn(5, 3, IMG, IMG, generator=torch.Generator().manual_seed(1))
    feats = collect_features(lkat, images, batch_size=2)
    names = residual_names(lkat)
    assert names == ["hook_embed", *(f"blocks.{i}.hook_resid_post" for i in range(DEPTH))]
    assert feature_kinds(lkat) == ("cls", "mean_patch")
    assert {k: tuple(v.shape) for k, v in feats.items()} == {"cls": (DEPTH + 1, 5, D), "mean_patch": (DEPTH + 1, 5, D)}
    _, cache = lkat.run_with_cache(images, names=names)
    for depth, name in enumerate(names):
        assert_close(feats["cls"][depth], cache[name][:, -1])
        assert_close(feats["mean_patch"][depth], cache[name][:, :N_PATCH].mean(1))
    assert torch.equal(feats["cls"][0], feats["cls"][0][:1].expand(5, -1))  # before block 0 it sees no image


def test_timm_vit_features_read_the_first_token_as_cls():
    torch.manual_seed(0)
    vit = lkat_lens.create_model(
        "vit_tiny_patch16_224", num_classes=2, img_size=IMG, patch_size=PATCH, depth=2, reg_tokens=2
    ).eval()
    images = torch.randn(3, 3, IMG, IMG, generator=torch.Generator().manual_seed(2))
    feats = collect_features(vit, images)
    _, cache = vit.run_with_cache(images, names=residual_names(vit))
    last = cache["blocks.1.hook_resid_post"]
    assert last.shape[1] == 1 + 2 + N_PATCH
    assert_close(feats["cls"][-1], last[:, 0])
    assert_close(feats["mean_patch"][-1], last[:, 3:].mean(1))
    assert feats["cls"].shape == (3, 3, vit.embed_dim)


def test_token_features_without_a_class_token():
    tokens = torch.arange(2 * 6 * 3, dtype=torch.float32).reshape(2, 6, 3)
    out = token_features(tokens, {"patches": slice(0, 4), "registers": slice(4, 6)})
    assert list(out) == ["mean_patch"]
    assert_close(out["mean_patch"], tokens[:, :4].mean(1))
    torch.manual_seed(0)
    mixer = attach_hook_points(MlpMixer(num_classes=2, img_size=IMG, patch_size=PATCH, num_blocks=2, embed_dim=32))
    assert feature_kinds(mixer) == ("mean_patch",)
    images = torch.randn(3, 3, IMG, IMG, generator=torch.Generator().manual_seed(3))
    feats = collect_features(mixer.eval(), images)
    _, cache = mixer.run_with_cache(images, names="blocks.1.hook_resid_post")
    assert list(feats) == ["mean_patch"] and feats["mean_patch"].shape == (3, 3, 32)
    assert_close(feats["mean_patch"][-1], cache["blocks.1.hook_resid_post"].mean(1))


def test_linear_probes_per_block_on_lkat(lkat):
    y_train = shuffled_labels(160, 240, seed=3)  # class 1 is the training majority
    y_test = shuffled_labels(100, 100, seed=4)
    x_train, x_test = half_bright_images(y_train, seed=5), half_bright_images(y_test, seed=6)
    results = linear_probes(lkat, x_train, y_train, x_test, y_test, batch_size=128)
    cls, mean_patch = results.test_accuracy["cls"], results.test_accuracy["mean_patch"]
    assert cls.shape == mean_patch.shape == (DEPTH + 1,)
    assert results.num_train == 400 and results.num_test == 200 and results.num_classes == 2
    assert results.chance == 0.5
    # Depth 0: the class token is the same vector for every image, so the probe predicts the training majority.
    assert cls[0] == (y_test == 1).float().mean().item()
    # Averaging patches erases where the bright half is: chance; after a block the class token has read it.
    assert mean_patch[0] < 0.65
    assert cls[1] >= 0.8 and results.best("cls")[0] >= 1
    assert (results.train_accuracy["cls"][1:] >= cls[1:] - 0.05).all()

    flipped = linear_probes(lkat, x_train, y_train, x_test, 1 - y_test, batch_size=128)
    for kind in ("cls", "mean_patch"):  # scored on the held-out labels: flipping them flips every prediction's score
        assert_allclose(flipped.test_accuracy[kind], 1 - results.test_accuracy[kind])
        np.testing.assert_array_equal(flipped.train_accuracy[kind], results.train_accuracy[kind])
    report = json.loads(json.dumps(results.to_dict()))
    assert report["test_accuracy"]["cls"] == cls.tolist() and len(report["depth_names"]) == DEPTH + 1


def test_linear_probes_rejects_mismatched_labels(lkat):
    images = torch.zeros(4, 3, IMG, IMG)
    with pytest.raises(ValueError, match="one label per image"):
        linear_probes(lkat, images, [0, 1, 0], images, [0, 1, 0, 1])
