"""timm conventions: every registered model carries a pretrained_cfg that timm.data.resolve_data_config reads, a
loaded checkpoint's records its own eval transform, and forward_intermediates matches the hook cache."""

from __future__ import annotations

import pytest
import timm
import torch
from timm.data import resolve_data_config, resolve_model_data_config
from timm.data.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

import lkat_lens
from lkat_lens.data import NORMALIZATION
from lkat_lens.models import registry


def test_resolve_data_config_of_every_small_registered_model():
    cfg = resolve_data_config(model=timm.create_model("lkat_micro", num_classes=10))
    assert cfg["input_size"] == (3, 16, 16) and cfg["crop_pct"] == 1.0 and cfg["interpolation"] == "bicubic"
    assert (cfg["mean"], cfg["std"]) == NORMALIZATION["digits"] == registry.DIGITS_NORMALIZATION
    for name in ("lkat_tiny_patch16_224", "rbfkat_tiny_patch16_224", "vit5_tiny_patch16_224"):
        model = timm.create_model(name, num_classes=10, img_size=32, depth=1)  # small: the shapes are what matter
        cfg = resolve_model_data_config(model)
        assert cfg["input_size"] == (3, 32, 32) and cfg["crop_pct"] == 0.875, name
        assert cfg["mean"] == IMAGENET_DEFAULT_MEAN and cfg["std"] == IMAGENET_DEFAULT_STD, name
        assert model.pretrained_cfg["num_classes"] == 10 and model.pretrained_cfg["classifier"] == "head"
        assert dict(model.named_modules())[model.pretrained_cfg["first_conv"]] is model.patch_embed.proj


def test_a_loaded_checkpoint_resolves_to_its_recorded_transform(digits_checkpoint):
    model, info = lkat_lens.load(digits_checkpoint)
    cfg = resolve_data_config(model=model)
    assert cfg["mean"] == tuple(info.data["mean"]) and cfg["std"] == tuple(info.data["std"])
    assert cfg["input_size"] == (3, info.data["img_size"], info.data["img_size"])


@pytest.mark.parametrize("name", ["lkat_micro", "vit5_tiny_patch16_224"])
def test_forward_intermediates_are_the_cached_residual_stream(name, images):
    torch.manual_seed(0)
    kwargs = {"img_size": 16, "patch_size": 4, "depth": 3} if name.startswith("vit5") else {}
    model = timm.create_model(name, num_classes=10, **kwargs).eval()
    with torch.no_grad():
        final, maps = model.forward_intermediates(images)
        logits, cache = model.run_with_cache(
            images, names_filter=lambda n: n.endswith(("hook_resid_post", "hook_final"))
        )
        last_two = model.forward_intermediates(images, indices=2, output_fmt="NLC", intermediates_only=True)
        normed = model.forward_intermediates(images, indices=[0], norm=True, intermediates_only=True)
    patches = model.token_layout["patches"]
    gh, gw = model.patch_embed.grid_size
    assert len(maps) == len(model.blocks) and torch.equal(final, cache["hook_final"])
    for block, got in enumerate(maps):
        want = cache["resid_post", block][:, patches]
        assert got.shape == (2, want.shape[-1], gh, gw)
        assert torch.equal(got.flatten(2).transpose(1, 2), want)
    assert [t.shape[1] for t in last_two] == [gh * gw] * 2
    assert torch.equal(last_two[-1], cache["resid_post", -1][:, patches])
    assert torch.equal(normed[0].flatten(2).transpose(1, 2), model.norm(cache["resid_post", 0])[:, patches])
    assert torch.equal(model.forward_head(final), logits)
