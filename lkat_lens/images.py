"""User image files -> model inputs: open, check, convert to RGB, resize and normalise like the checkpoint's data.

The one entry point for pictures that do not come from a dataset (the explorer's uploads, analyses of your own
images). Anything unreadable is refused with one `DataError`; anything readable is converted, and every change
made to it is listed in `LoadedImage.notes` so that a caller can say so.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from .data import DataError, eval_transform_for

MAX_IMAGE_PIXELS = 50_000_000  # larger pictures are refused before they are decoded (decompression bombs)
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


@dataclass(frozen=True)
class LoadedImage:
    """A picture as a normalised model input, with what was done to it."""

    tensor: torch.Tensor  # [3, H, W], the checkpoint's eval transform applied
    size: tuple[int, int]  # (width, height) of the file
    mode: str  # PIL mode of the file, e.g. "RGBA", "I;16"
    notes: tuple[str, ...]  # conversions made, for the user


def _open(source: str | Path | bytes, name: str) -> Image.Image:
    """PIL's lazy open (header only), with one DataError for every way it can fail."""
    if isinstance(source, bytes):
        if not source:
            raise DataError(f"{name} is empty, not an image")
        stream: Any = io.BytesIO(source)
    else:
        path = Path(source)
        if not path.is_file():
            raise DataError(f"{name}: no such file")
        stream = path
    try:
        return Image.open(stream)
    except UnidentifiedImageError:
        raise DataError(f"{name} is not an image file PIL can read") from None
    except Image.DecompressionBombError as err:
        raise DataError(f"{name} is too large to decode safely ({err})") from None
    except OSError as err:
        raise DataError(f"cannot read {name}: {err}") from None


def _decode(picture: Image.Image, name: str, max_pixels: int) -> Image.Image:
    """Decode the pixels after checking the size, turning decoder failures into DataError."""
    width, height = picture.size
    if width < 1 or height < 1:
        raise DataError(f"{name} has no pixels ({width}x{height})")
    if width * height > max_pixels:
        raise DataError(f"{name} is {width}x{height} pixels, over the limit of {max_pixels:,}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            picture.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombWarning) as err:
        raise DataError(f"{name} is corrupt or truncated ({err})") from None
    return picture


def _to_rgb(picture: Image.Image) -> tuple[Image.Image, list[str]]:
    """8-bit RGB: 16-bit gray scaled (not clipped) to 8 bits, alpha dropped, palettes and gray expanded."""
    notes = []
    if picture.mode in SIXTEEN_BIT_MODES:
        values = np.asarray(picture, dtype=np.float64)
        if picture.mode.startswith("I;16") or values.max(initial=0) > 255:
            values = values / 257.0
            notes.append(f"scaled {picture.mode} (16-bit) gray to 8 bits")
        picture = Image.fromarray(np.clip(np.round(values), 0, 255).astype(np.uint8), "L")
    elif picture.mode == "F":
        values = np.asarray(picture, dtype=np.float64)
        picture = Image.fromarray(np.clip(np.round(values), 0, 255).astype(np.uint8), "L")
        notes.append("clipped float (F) gray to 0-255")
    if picture.mode != "RGB":
        if "A" in picture.mode or "transparency" in picture.info:
            notes.append("dropped the alpha channel")
        notes.append(f"converted {picture.mode} to RGB")
        picture = picture.convert("RGB")
    return picture, notes


def load_image(
    source: str | Path | bytes,
    data_info: dict[str, Any],
    *,
    name: str | None = None,
    max_pixels: int = MAX_IMAGE_PIXELS,
) -> LoadedImage:
    """An image file (path or bytes) as the model input of a checkpoint whose data dict is `data_info`.

    Raises DataError with one line naming the problem: missing file, empty, not an image, corrupt or truncated,
    no pixels, or more than `max_pixels` pixels (checked before decoding).
    """
    name = name or (str(source) if not isinstance(source, bytes) else "the uploaded file")
    picture = _decode(_open(source, name), name, max_pixels)
    size, mode = picture.size, picture.mode
    picture, notes = _to_rgb(picture)
    side = int(data_info["img_size"])
    if size != (side, side):
        notes.append(f"resized and center-cropped {size[0]}x{size[1]} to the model's {side}x{side}")
    return LoadedImage(eval_transform_for(data_info)(picture), size, mode, tuple(notes))


def display_images(images: torch.Tensor, data: Mapping[str, Any]) -> np.ndarray:
    """Normalised images [B, C, H, W] back to displayable uint8 RGB [B, H, W, 3]."""
    mean = torch.tensor(data["mean"], dtype=images.dtype).view(1, -1, 1, 1)
    std = torch.tensor(data["std"], dtype=images.dtype).view(1, -1, 1, 1)
    pixels = (images.detach().cpu() * std + mean).clamp(0, 1)
    if pixels.shape[1] == 1:
        pixels = pixels.expand(-1, 3, -1, -1)
    return (pixels[:, :3] * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
