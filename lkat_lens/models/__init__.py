"""nn.Modules of lkat-lens: RBF-KAN layers, vision GLA, RoPE, LKAT, rbfKAT, hook points, timm registration."""

from __future__ import annotations

from typing import Any

from torch import nn

from .attention import ShortConvolution, VisionGLA, VisionMHSA
from .baselines import HookedTimm, attach_hook_points
from .hooks import ActivationCache, HookedModel, HookPoint
from .kan import KAN, KAN_BASES, KANLayer, RadialBasis
from .lkat import LKAT, KANBlock, RbfKAT
from .registry import VARIANTS, build_variant
from .vit5 import VIT5_VARIANTS, ViT5


def create_model(
    name: str, *, num_classes: int, img_size: int | None = None, in_chans: int = 3, **kwargs: Any
) -> nn.Module:
    """Build any model lkat-lens knows (LKAT/rbfKAT/ViT-5 variants or a timm baseline, with hook points) by name."""
    import timm

    if name not in VARIANTS and not timm.is_model(name):
        known = ", ".join(sorted(VARIANTS))
        raise ValueError(f"unknown model {name!r}; lkat-lens models: {known}; or any timm model name")
    if img_size is not None:
        kwargs["img_size"] = img_size
    model = timm.create_model(name, pretrained=False, num_classes=num_classes, in_chans=in_chans, **kwargs)
    return attach_hook_points(model) if name.startswith(("vit_", "mixer_")) else model


__all__ = [
    "ActivationCache",
    "HookedTimm",
    "VIT5_VARIANTS",
    "ViT5",
    "attach_hook_points",
    "HookPoint",
    "HookedModel",
    "KAN",
    "KANBlock",
    "KANLayer",
    "KAN_BASES",
    "LKAT",
    "RadialBasis",
    "RbfKAT",
    "ShortConvolution",
    "VARIANTS",
    "VisionGLA",
    "VisionMHSA",
    "build_variant",
    "create_model",
]
