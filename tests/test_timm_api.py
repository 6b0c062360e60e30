"""timm conventions: every registered model has a pretrained cfg in timm's registry that resolve_data_config reads
(a loaded checkpoint's records its own eval transform), forward_intermediates reads the residual stream,
prune_intermediate_layers and features_only work as for timm's ViT."""

from __future__ import annotations

import copy

import pytest
import timm
import torch
from timm.data import resolve_data_config, resolve_model_data_config
from timm.data.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import get_pretrained_cfg

import lkat_lens
from lkat_lens.data import NORMALIZATION
from lkat_lens.models import VARIANTS, VIT5_VARIANTS, registry
from lkat_lens.recipe import DEIT, DIGITS

NAMES = sorted([*VARIANTS, *VIT5_VARIANTS])
SMALL = {"img_size": 32, "depth": 2, "embed_dim": 32, "num_heads": 2}  # a 224² variant, cut down


def test_every_variant_is_registered_with_its_cfg():
    """Read from timm's registry without building: the digits transform for *_micro, timm's ImageNet one else."""
    assert sorted(timm.list_models(["lkat_*", "rbfkat_*", "vit5_*"])) == NAMES
    for name in NAMES:
        cfg = get_pretrained_cfg(name)
        micro = name.endswith("_micro")
        assert cfg.architecture == name and not cfg.has_weights
        assert cfg.input_size == ((3, 16, 16) if micro else (3, 224, 224)), name
        assert cfg.num_classes == (10 if micro else 1000)
        assert (cfg.mean, cfg.std) == (
            NORMALIZATION["digits"] if micro else (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)
        )
        assert cfg.crop_pct == (DIGITS.crop_pct if micro else DEIT.crop_pct) and cfg.interpolation == DEIT.interpolation
        assert (cfg.first_conv, cfg.classifier, cfg.fixed_input_size) == ("patch_embed.proj", "head", True)
    assert registry.DIGITS_NORMALIZATION == NORMALIZATION["digits"] and registry.DIGITS_CROP_PCT == DIGITS.crop_pct


@pytest.mark.parametrize("name", ["lkat_tiny_patch16_224", "rbfkat_tiny_patch16_224", "vit5_tiny_patch16_224"])
def test_a_model_built_with_its_defaults_carries_the_registered_cfg(name):
    model = timm.create_model(name)
    assert model.pretrained_cfg == get_pretrained_cfg(name).to_dict() and model.default_cfg is model.pretrained_cfg
    assert model.patch_embed.img_size == (224, 224) and model.num_classes == 1000


@pytest.mark.parametrize("name", NAMES)
def test_resolve_data_config_follows_the_built_size_and_classes(name):
    micro = name.endswith("_micro")
    kwargs = {"img_size": 24, "depth": 1} if micro else SMALL
    model = timm.create_model(name, num_classes=7, **kwargs)
    registered = resolve_data_config(pretrained_cfg=get_pretrained_cfg(name).to_dict())
    side = kwargs["img_size"]
    assert (
        resolve_data_config(model=model)
        == resolve_model_data_config(model)
        == registered | {"input_size": (3, side, side)}
    )
    assert model.patch_embed.img_size == (side, side) and model.pretrained_cfg["num_classes"] == model.num_classes == 7
    modules = dict(model.named_modules())
    assert modules[model.pretrained_cfg["first_conv"]] is model.patch_embed.proj
    assert modules[model.pretrained_cfg["classifier"]] is model.get_classifier()


def test_pretrained_cfg_overlay_and_no_weights():
    model = timm.create_model("lkat_micro", pretrained_cfg_overlay={"crop_pct": 0.9, "mean": (0.5,) * 3})
    cfg = resolve_data_config(model=model)
    assert cfg["crop_pct"] == 0.9 and cfg["mean"] == (0.5,) * 3 and cfg["std"] == registry.DIGITS_NORMALIZATION[1]
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model("lkat_micro", pretrained=True)


def test_a_loaded_checkpoint_resolves_to_its_recorded_transform(digits_checkpoint):
    model, info = lkat_lens.load(digits_checkpoint)
    cfg = resolve_data_config(model=model)
    assert cfg["mean"] == tuple(info.data["mean"]) and cfg["std"] == tuple(info.data["std"])
    assert cfg["input_size"] == (3, info.data["img_size"], info.data["img_size"])


MODELS = {
    "lkat_micro": {"depth": 3},
    "rbfkat_tiny_patch16_224": {**SMALL, "img_size": 16, "patch_size": 4, "depth": 3},
    "vit5_micro": {"depth": 3},
}


def build(name: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, num_classes=10, **MODELS[name], **kwargs).eval()


def patch_map(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The patch tokens of [B, T, D] as [B, D, gh, gw], written out."""
    patches = tokens[:, model.token_layout["patches"]]
    gh, gw = model.patch_embed.grid_size
    return patches.reshape(patches.shape[0], gh, gw, -1).permute(0, 3, 1, 2)


@pytest.mark.parametrize("name", list(MODELS))
def test_forward_intermediates_are_the_residual_stream(name, images):
    """Each block's output (the blocks applied one by one to the cached embedding, and the cached
    hook_resid_post), its patch tokens as NCHW maps; the final features are forward_features."""
    model = build(name)
    with torch.no_grad():
        final, maps = model.forward_intermediates(images)
        logits, cache = model.run_with_cache(images, names_filter=lambda n: n.endswith(("resid_post", "embed")))
        x, stream = cache["hook_embed"], []
        for block in model.blocks:
            x = block(x)
            stream.append(x)
        last_two = model.forward_intermediates(images, indices=2, output_fmt="NLC", intermediates_only=True)
        picked = model.forward_intermediates(images, indices=[0, -1], norm=True, intermediates_only=True)
        with_prefix = model.forward_intermediates(
            images, indices=[1], return_prefix_tokens=True, intermediates_only=True
        )
        assert torch.equal(final, model.forward_features(images)) and torch.equal(model.forward_head(final), logits)
        assert torch.equal(logits, model(images))
    assert len(maps) == len(model.blocks) == 3
    for block, got in enumerate(maps):
        assert torch.equal(got, patch_map(model, stream[block]))
        assert torch.equal(got, patch_map(model, cache["resid_post", block]))
    patches = model.token_layout["patches"]
    assert [t.shape for t in last_two] == [stream[0][:, patches].shape] * 2
    assert torch.equal(last_two[0], stream[1][:, patches]) and torch.equal(last_two[1], stream[2][:, patches])
    assert torch.equal(picked[0], patch_map(model, model.norm(stream[0])))
    assert torch.equal(picked[1], patch_map(model, model.norm(stream[2])))
    ((got, prefix),) = with_prefix
    others = [i for i in range(stream[1].shape[1]) if i not in range(patches.start, patches.stop)]
    assert torch.equal(got, maps[1]) and torch.equal(prefix, stream[1][:, others])


@pytest.mark.parametrize("name", list(MODELS))
def test_prune_intermediate_layers_keeps_what_the_indices_need(name, images):
    model = build(name)
    pruned = copy.deepcopy(model)
    assert pruned.prune_intermediate_layers([0, 1], prune_norm=True) == [0, 1]
    assert len(pruned.blocks) == 2 and isinstance(pruned.norm, torch.nn.Identity) and pruned.num_classes == 0
    with torch.no_grad():
        want = model.forward_intermediates(images, indices=[0, 1], intermediates_only=True)
        got = pruned.forward_intermediates(images, indices=[0, 1], intermediates_only=True)
        _, cache = model.run_with_cache(images, names_filter="blocks.1.hook_resid_post")
        assert torch.equal(pruned.forward_features(images), cache["resid_post", 1])  # no norm after block 1
        assert torch.equal(pruned(images), cache["resid_post", 1][:, model.token_layout["cls"].start])  # no head
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert copy.deepcopy(model).prune_intermediate_layers(1, prune_head=False) == [2]


@pytest.mark.parametrize("name", list(MODELS))
def test_features_only_is_timms_feature_getter(name, images):
    features = build(name, features_only=True, out_indices=(0, 2))
    assert features.feature_info.channels() == [features.model.embed_dim] * 2
    assert features.feature_info.reduction() == [4, 4] and len(features.model.blocks) == 3
    with torch.no_grad():
        want = build(name).forward_intermediates(images, indices=[0, 2], intermediates_only=True)
        got = features(images)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert features.pretrained_cfg["input_size"] == (3, 16, 16)
