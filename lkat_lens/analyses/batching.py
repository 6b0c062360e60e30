"""Feeding images to a model in batches on its device: the analyses stream over any number of images this way."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

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


@contextmanager
def full_fp32() -> Iterator[None]:
    """fp32 matrix multiplies (no TF32, which a training run in the same process may have switched on) for the
    duration of a with-block: TF32's 10-bit mantissa moves reported numbers by more than 1e-3."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
