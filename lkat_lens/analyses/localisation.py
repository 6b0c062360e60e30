"""How well relevance maps [B, H, W] pick out the object masks [B, H, W] (bool): localisation metrics per image.

- pointing game (Zhang et al.): the share of the map's maximal pixels (all of them, if tied) inside the mask,
  optionally grown by `tolerance` pixels (Quantus' and Zhang et al.'s tolerance; a disc of that radius), so a
  constant map scores the mask's area, the chance level;
- relevance mass (Arras et al.): positive relevance inside the mask / all positive relevance;
- relevance rank accuracy (Arras et al.): the share of the K most relevant pixels inside the mask, K = mask area
  (ties at the K-th value shared out evenly, the expectation under random tie-breaking);
- the segmentation test of Chefer et al. and Ali et al.: the map binarised at its mean (object where map > mean)
  scored by pixel accuracy and mIoU (IoU of object and of background, averaged), and the average precision of the
  raw pixel scores against the mask (scikit-learn's average_precision_score).

Every metric is per image (mIoU too: Chefer et al. pool intersections over the data set; here images are averaged
later). An image whose mask is empty scores NaN on every metric. Patch maps reach pixels through
`upsample`, the one place that does it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from sklearn.metrics import average_precision_score

METRICS = ("pointing_game", "relevance_mass", "relevance_rank", "pixel_accuracy", "miou", "average_precision")


def upsample(maps: torch.Tensor, image_hw: tuple[int, int]) -> torch.Tensor:
    """Maps [B, h, w] at image resolution [B, H, W]: patch maps bilinearly interpolated (as Chefer et al. and
    Ali et al. do), pixel maps returned as they are."""
    if tuple(maps.shape[-2:]) == tuple(image_hw):
        return maps
    return F.interpolate(maps.unsqueeze(1), size=tuple(image_hw), mode="bilinear", align_corners=False).squeeze(1)


def check_masks(maps: torch.Tensor, masks: torch.Tensor) -> None:
    """ValueError unless masks are bool [B, H, W] of the maps' shape."""
    if masks.dtype != torch.bool:
        raise ValueError(f"masks must be bool, got {masks.dtype}")
    if masks.shape != maps.shape:
        raise ValueError(f"masks {tuple(masks.shape)} do not match the pixel maps {tuple(maps.shape)}")


def grown(masks: torch.Tensor, tolerance: int) -> torch.Tensor:
    """Masks grown by every pixel within `tolerance` pixels (Euclidean) of the object."""
    if tolerance <= 0:
        return masks
    r = int(tolerance)
    yy, xx = torch.meshgrid(torch.arange(-r, r + 1), torch.arange(-r, r + 1), indexing="ij")
    disc = (yy**2 + xx**2 <= r * r).to(masks.device, torch.float32)
    return F.conv2d(masks.unsqueeze(1).float(), disc[None, None], padding=r).squeeze(1) > 0


def pointing_game(maps: torch.Tensor, masks: torch.Tensor, tolerance: int = 0) -> torch.Tensor:
    """Share [B] of each map's maximal pixels that fall in the (grown) mask: 1 or 0 without ties."""
    flat = maps.flatten(1)
    top = flat == flat.max(1, keepdim=True).values
    hits = (top & grown(masks, tolerance).flatten(1)).sum(1)
    return hits.to(maps.dtype) / top.sum(1)


def relevance_mass(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Positive relevance inside the mask over all positive relevance [B] (NaN for a map with none)."""
    positive = maps.clamp(min=0).flatten(1)
    return (positive * masks.flatten(1)).sum(1) / positive.sum(1)


def relevance_rank(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Share [B] of the K = |mask| most relevant pixels that lie in the mask; pixels tied with the K-th value count
    in proportion to how many of the tied pixels are inside."""
    flat, inside = maps.flatten(1), masks.flatten(1)
    k = inside.sum(1)
    ordered = flat.sort(1, descending=True).values
    kth = ordered.gather(1, (k - 1).clamp(min=0)[:, None])
    above, tied = flat > kth, flat == kth
    share_tied = (tied & inside).sum(1).to(maps.dtype) / tied.sum(1)
    hits = (above & inside).sum(1) + (k - above.sum(1)) * share_tied
    return torch.where(k > 0, hits / k, math.nan)


def segmentation_scores(maps: torch.Tensor, masks: torch.Tensor) -> dict[str, torch.Tensor]:
    """Pixel accuracy and mIoU [B] of the map binarised at its mean (object where the map exceeds it)."""
    flat, inside = maps.flatten(1), masks.flatten(1)
    mean = torch.maximum(flat.mean(1, keepdim=True), flat.min(1, keepdim=True).values)  # no rounding below the min
    predicted = flat > mean
    accuracy = (predicted == inside).to(maps.dtype).mean(1)
    iou_object = (predicted & inside).sum(1) / (predicted | inside).sum(1)
    iou_background = (~predicted & ~inside).sum(1) / (~predicted | ~inside).sum(1)
    return {"pixel_accuracy": accuracy, "miou": ((iou_object + iou_background) / 2).to(maps.dtype)}


def average_precision(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Average precision [B] of the pixel scores against the mask (NaN for an empty mask), on the CPU."""
    scores, truth = maps.flatten(1).detach().double().cpu().numpy(), masks.flatten(1).cpu().numpy()
    values = [average_precision_score(t, s) if t.any() else math.nan for s, t in zip(scores, truth, strict=True)]
    return torch.tensor(values, dtype=maps.dtype, device=maps.device)


def localisation_scores(maps: torch.Tensor, masks: torch.Tensor, tolerance: int = 0) -> dict[str, torch.Tensor]:
    """Every metric of METRICS [B] for pixel maps [B, H, W] (patch maps: `upsample` them first) and masks."""
    check_masks(maps, masks)
    masks = masks.to(maps.device)
    scores = {
        "pointing_game": pointing_game(maps, masks, tolerance),
        "relevance_mass": relevance_mass(maps, masks),
        "relevance_rank": relevance_rank(maps, masks),
        **segmentation_scores(maps, masks),
        "average_precision": average_precision(maps, masks),
    }
    empty = ~masks.flatten(1).any(1)
    return {name: scores[name].masked_fill(empty, math.nan) for name in METRICS}
