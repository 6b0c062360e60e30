"""timm registry entries: `timm.create_model("lkat_tiny_patch16_224", num_classes=10)` after `import lkat_lens`."""

from __future__ import annotations

from typing import Any

from timm.data.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import register_model
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

_TIMM_ONLY_KWARGS = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")
_BUILDERS: dict[str, tuple[type[nn.Module], dict[str, Any]]] = {}


def build_variant(name: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """Build a registered lkat-lens variant; keyword arguments override its defaults."""
    if pretrained:
        raise ValueError(f"no pretrained weights are published for {name}; load a checkpoint with lkat_lens.load")
    for key in _TIMM_ONLY_KWARGS:
        kwargs.pop(key, None)
    cls, defaults = _BUILDERS[name]
    model = cls(**{**defaults, **kwargs})
    model.pretrained_cfg = model.default_cfg = data_config(name, model)
    return model


# The eval-time data settings of each model (timm's pretrained_cfg): the digits normalisation for lkat_micro (its
# default dataset), ImageNet's for the 224² variants (timm's convention for models trained from scratch).
DIGITS_NORMALIZATION = (
    (0.3053,) * 3,
    (0.3759,) * 3,
)  # lkat_lens.data.NORMALIZATION["digits"] (a test keeps them equal)


def data_config(name: str, model: nn.Module) -> dict[str, Any]:
    """timm's pretrained_cfg of a built model: input size, normalisation, crop, interpolation, classes, layer names
    (so that timm.data.resolve_data_config(model=m) returns the model's own eval transform settings)."""
    mean, std = DIGITS_NORMALIZATION if name == "lkat_micro" else (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)
    height, width = model.patch_embed.img_size
    return {
        "architecture": name,
        "input_size": (3, height, width),
        "interpolation": "bicubic",
        "crop_pct": 1.0 if name == "lkat_micro" else 0.875,
        "crop_mode": "center",
        "mean": tuple(mean),
        "std": tuple(std),
        "num_classes": model.num_classes,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
    }


def register_variants(variants: dict[str, tuple[type[nn.Module], dict[str, Any]]]) -> None:
    """Put each name -> (class, default kwargs) into timm's registry."""
    for name, (cls, defaults) in variants.items():
        _BUILDERS[name] = (cls, defaults)

        def create(pretrained: bool = False, _name: str = name, **kwargs: Any) -> nn.Module:
            return build_variant(_name, pretrained, **kwargs)

        create.__name__ = create.__qualname__ = name
        create.__doc__ = f"{name} ({cls.__name__})."
        create.__module__ = __name__
        register_model(create)


register_variants(VARIANTS)
