"""Feeding images to a model in batches on its device: the analyses stream over any number of images this way."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn

Images = torch.Tensor | Iterable[torch.Tensor]  # one tensor [N, C, H, W], or batches of them (a DataLoader's images)


def batches(images: Images, batch_size: int | None = None) -> Iterator[torch.Tensor]:
    """One tensor split into batches of `batch_size` (whole when None), or the given batches passed through."""
    if isinstance(images, torch.Tensor):
        yield from (images.split(batch_size) if batch_size else (images,))
    else:
        yield from images


def on_model(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The images on the model's device, in its floating dtype."""
    param = next(model.parameters())
    return images.to(param.device, param.dtype)
