"""timm registry entries: `timm.create_model("lkat_tiny_patch16_224", num_classes=10)` after `import lkat_lens`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from timm.data.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import to_2tuple
from timm.models import DefaultCfg, build_model_with_cfg, generate_default_cfgs, register_model, resolve_pretrained_cfg
from torch import nn

from .lkat import LKAT, RbfKAT

# name -> (class, architecture defaults). Dims/heads/depth from the paper's "LKAT variants" table.
VARIANTS: dict[str, tuple[type[LKAT], dict[str, Any]]] = {
    "lkat_micro": (LKAT, dict(img_size=16, patch_size=4, embed_dim=64, depth=4, num_heads=2, num_classes=10)),
    "lkat_tiny_patch16_224": (LKAT, dict(embed_dim=192, depth=12, num_heads=3)),
    "lkat_small_patch16_224": (LKAT, dict(embed_dim=384, depth=12, num_heads=6)),
    "lkat_base_patch16_224": (LKAT, dict(embed_dim=768, depth=12, num_heads=12)),
    "lkat_large_patch16_224": (LKAT, dict(embed_dim=1024, depth=24, num_heads=16)),
    "rbfkat_tiny_patch16_224": (RbfKAT, dict(embed_dim=192, depth=12, num_heads=3)),
    "rbfkat_small_patch16_224": (RbfKAT, dict(embed_dim=384, depth=12, num_heads=6)),
    "rbfkat_base_patch16_224": (RbfKAT, dict(embed_dim=768, depth=12, num_heads=12)),
}

# timm's register_model reads each name's pretrained cfg from this module's `default_cfgs` (timm.models.
# get_pretrained_cfg(name) then answers without building); register_variants fills it.
default_cfgs: dict[str, DefaultCfg] = {}
_BUILDERS: dict[str, tuple[type[nn.Module], dict[str, Any]]] = {}
DEFAULT_OUT_INDICES = 3  # features_only: the last 3 blocks, as timm's ViT


def build_variant(
    name: str,
    pretrained: bool = False,
    pretrained_cfg: str | dict[str, Any] | None = None,
    pretrained_cfg_overlay: dict[str, Any] | None = None,
    cache_dir: str | None = None,
    **kwargs: Any,
) -> nn.Module:
    """Build a registered lkat-lens variant through timm's build_model_with_cfg; keyword arguments override its
    defaults. Its pretrained_cfg is the registered one with the input size and class count it was built with;
    features_only=True (out_indices=...) gives timm's FeatureGetterNet; cache_dir is accepted for timm's
    create_model (nothing is downloaded)."""
    if pretrained:
        raise ValueError(f"no pretrained weights are published for {name}; load a checkpoint with lkat_lens.load")
    cls, defaults = _BUILDERS[name]
    args = {**defaults, **kwargs}
    cfg = resolve_pretrained_cfg(name, pretrained_cfg=pretrained_cfg, pretrained_cfg_overlay=pretrained_cfg_overlay)
    chans, size = args.get("in_chans", cfg.input_size[0]), to_2tuple(args.get("img_size", cfg.input_size[1:]))
    cfg = replace(cfg, input_size=(chans, *size), num_classes=args.get("num_classes", cfg.num_classes))
    feature_cfg = {"feature_cls": "getter", "out_indices": args.pop("out_indices", DEFAULT_OUT_INDICES)}
    return build_model_with_cfg(
        cls, name, pretrained=False, pretrained_cfg=cfg.to_dict(), feature_cfg=feature_cfg, **args
    )


# The eval-time data settings of each model (timm's pretrained_cfg): the digits normalisation for the *_micro
# variants (16², 10 classes: the digits default), ImageNet's for the 224² variants (timm's convention for models
# trained from scratch).
DIGITS_NORMALIZATION = (
    (0.3053,) * 3,
    (0.3759,) * 3,
)  # lkat_lens.data.NORMALIZATION["digits"] (a test keeps them equal)
DIGITS_CROP_PCT = 1.0  # recipe.DIGITS.crop_pct (a test keeps them equal)


def variant_cfg(name: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """timm's pretrained_cfg of a variant with its default size and classes (the classes default to 224² and 1000):
    normalisation, crop, interpolation, layer names, so that timm.data.resolve_data_config(model=m) returns the
    model's own eval transform settings."""
    digits = name.endswith("_micro")
    mean, std = DIGITS_NORMALIZATION if digits else (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)
    size = to_2tuple(defaults.get("img_size", 224))
    return {
        "input_size": (3, *size),
        "fixed_input_size": True,
        "interpolation": "bicubic",
        "crop_pct": DIGITS_CROP_PCT if digits else 0.875,
        "crop_mode": "center",
        "mean": tuple(mean),
        "std": tuple(std),
        "num_classes": defaults.get("num_classes", 1000),
        "first_conv": "patch_embed.proj",
        "classifier": "head",
    }


def register_variants(variants: dict[str, tuple[type[nn.Module], dict[str, Any]]]) -> None:
    """Put each name -> (class, default kwargs) and its pretrained cfg into timm's registry."""
    default_cfgs.update(
        generate_default_cfgs({name: variant_cfg(name, defaults) for name, (_, defaults) in variants.items()})
    )
    for name, (cls, defaults) in variants.items():
        _BUILDERS[name] = (cls, defaults)

        def create(pretrained: bool = False, _name: str = name, **kwargs: Any) -> nn.Module:
            return build_variant(_name, pretrained, **kwargs)

        create.__name__ = create.__qualname__ = name
        create.__doc__ = f"{name} ({cls.__name__})."
        create.__module__ = __name__
        register_model(create)


register_variants(VARIANTS)
