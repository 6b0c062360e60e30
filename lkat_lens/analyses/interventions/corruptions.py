"""Corrupted inputs for activation patching: Gaussian noise, blur, patch shuffle or another image, seeded."""

from __future__ import annotations

import torch

from ..attributions import blurred

__all__ = ["CORRUPTIONS", "corrupt"]

CORRUPTIONS = ("noise", "blur", "shuffle")
NOISE_STD = 1.0  # "noise": added Gaussian noise, in the normalised input's units (about one pixel std)
BLUR_FRACTION = 1 / 16  # "blur": Gaussian sigma as a fraction of the image side


def corrupt(
    images: torch.Tensor,
    how: str | torch.Tensor,
    *,
    patch_size: tuple[int, int] | None = None,
    seed: int = 0,
    noise_std: float = NOISE_STD,
    sigma: float | None = None,
) -> torch.Tensor:
    """Corrupted copies of images [B,C,H,W]: "noise" (images + noise_std * N(0, 1)), "blur" (Gaussian, sigma
    default side/16), "shuffle" (the patches of `patch_size` permuted, one seeded permutation for every image),
    or another image / batch (a tensor [C,H,W] or [B,C,H,W], expanded to the batch)."""
    if isinstance(how, torch.Tensor):
        other = how.to(images)
        if other.shape[-3:] != images.shape[-3:]:
            raise ValueError(f"the corrupting image is {tuple(other.shape[-3:])}, the clean {tuple(images.shape[-3:])}")
        return other.expand_as(images).clone()
    generator = torch.Generator().manual_seed(seed)
    if how == "noise":
        noise = torch.randn(images.shape, generator=generator, dtype=torch.float64)
        return images + (noise_std * noise).to(images)
    if how == "blur":
        return blurred(images, sigma if sigma is not None else max(images.shape[-2:]) * BLUR_FRACTION)
    if how == "shuffle":
        if patch_size is None:
            raise ValueError("corruption 'shuffle' needs the model's patch_size")
        return _shuffle_patches(images, patch_size, generator)
    raise ValueError(f"unknown corruption {how!r}; choose from {CORRUPTIONS} or pass an image tensor")


def _shuffle_patches(images: torch.Tensor, patch_size: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
    b, c, h, w = images.shape
    ph, pw = patch_size
    if h % ph or w % pw:
        raise ValueError(f"images {h}x{w} do not tile into {ph}x{pw} patches")
    gh, gw = h // ph, w // pw
    patches = images.reshape(b, c, gh, ph, gw, pw).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c, ph, pw)
    order = torch.randperm(gh * gw, generator=generator).to(images.device)
    shuffled = patches[:, order].reshape(b, gh, gw, c, ph, pw).permute(0, 3, 1, 4, 2, 5)
    return shuffled.reshape(b, c, h, w)
