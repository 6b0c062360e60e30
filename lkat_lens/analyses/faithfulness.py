"""Are the maps right? Faithfulness, localisation and randomisation tests of every relevance map lkat-lens draws.

Maps (`MAP_METHODS`): the six captum attributions (`attributions.attribute`, pixel maps, channels summed), the
class token's implicit attention in the last block (head mean, `attention.cls_attention`), attention rollout and
Chefer's gradient rollout (`attention.attention_rollout`), and a seeded uniform-noise map as the chance reference.
Each map explains the target class (default: the model's prediction) of each image and is scored per image:

- positive / negative perturbation (Chefer et al.; Ali et al.): the patches are removed most-relevant first
  (positive) or least-relevant first (negative) in 10 % steps, replaced by zeros (the data set's mean image), and
  the target class's softmax probability is measured (not top-1 accuracy); the AUC over the removed fraction
  should be low for positive and high for negative perturbation. Both come from one `deletion_insertion` run: its
  insertion of the k most relevant patches is the removal of the n - k least relevant ones;
- deletion / insertion AUC (`attributions.deletion_insertion` with its defaults: 16 steps, blurred patches);
- localisation against the object mask (`localisation.localisation_scores`, patch maps upsampled bilinearly);
- MPRT (Adebayo et al.'s cascading model-parameter randomisation): the blocks are randomised from the top one
  down, each parameter tensor redrawn from a seeded normal with the trained tensor's own mean and standard
  deviation (norm weights stay near 1, weight matrices keep their scale; one-element and constant tensors, such
  as an untrained norm's weights, are kept), and each
  map of the randomised model is compared with the trained model's by Spearman rank correlation of the absolute
  map values. A map that ignores the weights keeps correlation 1; a map that explains the model falls towards 0.
  Integrated Gradients runs with MPRT_IG_STEPS fixed steps on the randomised models (unless n_steps is given).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from . import attributions
from .attention import attention_rollout, cls_attention
from .batching import on_model
from .localisation import METRICS as LOCALISATION_METRICS
from .localisation import localisation_scores, upsample
from .parts import TargetLike, eval_mode, resolve_target, targets_for

ATTENTION_MAPS = ("cls_attention", "rollout", "gradient_rollout")
MAP_METHODS = (*attributions.METHODS, *ATTENTION_MAPS, "random")
PERTURBATION_STEPS = 10  # positive/negative perturbation in 10 % steps
MPRT_IG_STEPS = attributions.IG_STEPS[0]  # Integrated Gradients' path steps on the randomised models
FAITHFULNESS_METRICS = ("positive_auc", "negative_auc", "deletion_auc", "insertion_auc")
METRICS = (*LOCALISATION_METRICS, *FAITHFULNESS_METRICS, "mprt")
HIGHER_IS_BETTER = {m: m not in ("positive_auc", "deletion_auc", "mprt") for m in METRICS}


def map_methods(model: nn.Module) -> tuple[str, ...]:
    """The methods that apply to a model: attention maps only with a class token."""
    has_cls = "cls" in getattr(model, "token_layout", {})
    return tuple(m for m in MAP_METHODS if has_cls or m not in ATTENTION_MAPS)


def check_method(model: nn.Module, method: str) -> None:
    """ValueError for an unknown method or one the model cannot give."""
    if method not in MAP_METHODS:
        raise ValueError(f"unknown map method {method!r}; choose from {MAP_METHODS}")
    if method not in map_methods(model):
        raise ValueError(f"{method} needs a class token, which {type(model).__name__} does not have")


def random_maps(shape: tuple[int, int, int], first_image: int, seed: int, device: torch.device) -> torch.Tensor:
    """Uniform noise maps [B, H, W], each seeded by seed and the image's index (the same whatever the batching)."""
    maps = [
        torch.rand(shape[1:], generator=torch.Generator().manual_seed(seed + first_image + b)) for b in range(shape[0])
    ]
    return torch.stack(maps).to(device)


def relevance_map(
    model: nn.Module,
    images: torch.Tensor,
    method: str,
    target: torch.Tensor,
    *,
    first_image: int = 0,
    seed: int = 0,
    settings: dict[str, Any] | None = None,
) -> torch.Tensor:
    """One method's map of the target classes [B]: a pixel map [B, H, W] (attributions, random) or a patch map
    [B, gh, gw] (attention maps), on the model's device. `settings` go to the captum method."""
    check_method(model, method)
    x = on_model(model, images)
    if method in attributions.METHODS:
        return attributions.attribute(model, x, method, target, **(settings or {})).pixel_map
    if method == "cls_attention":
        last = len(model.blocks) - 1
        return cls_attention(model, x, [last]).patch_maps[0].mean(1)
    if method == "rollout":
        return attention_rollout(model, x, "attention").cls_map
    if method == "gradient_rollout":
        return attention_rollout(model, x, "gradient", target).cls_map
    return random_maps((x.shape[0], *x.shape[-2:]), first_image, seed, x.device).to(x.dtype)


def perturbation_scores(
    model: nn.Module, images: torch.Tensor, maps: torch.Tensor, target: torch.Tensor, batch_size: int = 64
) -> dict[str, torch.Tensor]:
    """Positive/negative perturbation and deletion/insertion curves [B, S] and their AUCs [B] of maps [B, h, w]."""
    chefer = attributions.deletion_insertion(
        model, images, maps, PERTURBATION_STEPS, replacement="zeros", target=target, batch_size=batch_size
    )
    negative_fractions = 1 - chefer.fractions.flip(0)
    negative = chefer.insertion.flip(-1)
    curves = attributions.deletion_insertion(model, images, maps, target=target, batch_size=batch_size)
    return {
        "perturbation_fractions": chefer.fractions,
        "positive": chefer.deletion,
        "negative": negative,
        "positive_auc": chefer.deletion_auc,
        "negative_auc": attributions.curve_auc(negative_fractions, negative),
        "deletion_fractions": curves.fractions,
        "deletion": curves.deletion,
        "insertion": curves.insertion,
        "deletion_auc": curves.deletion_auc,
        "insertion_auc": curves.insertion_auc,
    }


def score_maps(
    model: nn.Module,
    images: torch.Tensor,
    masks: torch.Tensor,
    maps: torch.Tensor,
    target: torch.Tensor,
    *,
    tolerance: int = 0,
    batch_size: int = 64,
) -> dict[str, torch.Tensor]:
    """Localisation (against masks [B, H, W]) and perturbation scores [B] and curves of maps [B, h, w]."""
    x = on_model(model, images)
    pixels = upsample(maps, tuple(x.shape[-2:]))
    found = perturbation_scores(model, x, maps, target, batch_size)
    return localisation_scores(pixels, masks.to(pixels.device), tolerance) | found


def spearman(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spearman rank correlation [B] of maps a and b [B, ...] (average ranks for ties; NaN for a constant map)."""

    def ranks(x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(1).double()
        ordered = flat.sort(1).values
        low = torch.searchsorted(ordered, flat, side="left")
        high = torch.searchsorted(ordered, flat, side="right")
        return (low + high - 1).double() / 2

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(1, keepdim=True), rb - rb.mean(1, keepdim=True)
    return (ra * rb).sum(1) / ((ra * ra).sum(1) * (rb * rb).sum(1)).sqrt()  # exactly 1 for equal ranks


@torch.no_grad()
def randomise_block(block: nn.Module, seed: int) -> None:
    """Redraw every parameter tensor of a block (in place) from a seeded normal with its own mean and std."""
    generator = torch.Generator().manual_seed(seed)
    for param in block.parameters():
        if param.numel() < 2:
            continue
        mean, std = param.double().mean().item(), param.double().std().item()
        noise = torch.randn(param.shape, generator=generator, dtype=torch.float64)
        param.copy_((noise * std + mean).to(param))


@dataclass
class MethodEvaluation:
    """One map method's scores on a set of images with object masks: per image, plus the MPRT correlations."""

    method: str
    target: torch.Tensor  # [N] the class each map explains
    scores: dict[str, torch.Tensor]  # metric (LOCALISATION_METRICS, FAITHFULNESS_METRICS) -> [N]
    curves: dict[str, torch.Tensor]  # "positive", "negative" [N, 11], "deletion", "insertion" [N, 17]
    fractions: dict[str, torch.Tensor]  # "perturbation" [11] and "deletion" [17]: fraction of patches removed
    mprt_blocks: list[int] = field(default_factory=list)  # the block randomised at each depth, the top one first
    mprt: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0))  # [depths, M] Spearman per image

    def summary(self) -> dict[str, float]:
        """Every metric of METRICS averaged over the images (NaNs left out); mprt over depths and images."""
        means = {m: float(self.scores[m].double().nanmean()) for m in METRICS if m in self.scores}
        means["mprt"] = float(self.mprt.double().nanmean()) if self.mprt.numel() else math.nan
        return means

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the summary, per-image scores, mean curves and the MPRT curve (mean over images per depth)."""
        return {
            "method": self.method,
            "summary": self.summary(),
            "target": self.target.tolist(),
            "scores": {m: v.tolist() for m, v in self.scores.items()},
            "fractions": {k: v.tolist() for k, v in self.fractions.items()},
            "mean_curves": {k: v.double().mean(0).tolist() for k, v in self.curves.items()},
            "mprt_blocks": self.mprt_blocks,
            "mprt_per_depth": self.mprt.double().nanmean(1).tolist() if self.mprt.numel() else [],
            "mprt": self.mprt.tolist(),
        }


def mprt_correlations(
    model: nn.Module,
    images: torch.Tensor,
    method: str,
    target: torch.Tensor,
    trained: torch.Tensor,
    *,
    seed: int = 0,
    batch_size: int = 64,
    settings: dict[str, Any] | None = None,
) -> tuple[list[int], torch.Tensor]:
    """Blocks randomised top first, and the Spearman correlation [depths, B] of each depth's maps with `trained`
    (the trained model's maps of the same images). The model itself is left untouched (a copy is randomised)."""
    if method == "integrated_gradients":  # a randomised model's IG rarely converges: fixed steps, not up to 1024
        settings = {"n_steps": MPRT_IG_STEPS, **(settings or {})}
    randomised = copy.deepcopy(model).eval()
    order = list(reversed(range(len(randomised.blocks))))
    rows = []
    for block in order:
        randomise_block(randomised.blocks[block], seed + block)
        row = []
        for start in range(0, images.shape[0], batch_size):
            stop = start + batch_size
            found = relevance_map(
                randomised,
                images[start:stop],
                method,
                target[start:stop],
                first_image=start,
                seed=seed,
                settings=settings,
            )
            row.append(spearman(found.abs(), trained[start:stop].to(found.device).abs()))
        rows.append(torch.cat(row))
    return order, torch.stack(rows)


def evaluate_method(
    model: nn.Module,
    images: torch.Tensor,
    masks: torch.Tensor,
    method: str,
    target: TargetLike = None,
    *,
    batch_size: int = 64,
    mprt_images: int = 16,
    tolerance: int = 0,
    seed: int = 0,
    settings: dict[str, Any] | None = None,
) -> MethodEvaluation:
    """Score one map method on images [N, C, H, W] with object masks [N, H, W] (bool), in batches on the model's
    device: localisation and perturbation on every image, MPRT on the first `mprt_images` (0: none)."""
    check_method(model, method)
    if masks.shape != (images.shape[0], *images.shape[-2:]):
        raise ValueError(f"masks {tuple(masks.shape)} do not match images {tuple(images.shape)}: need [N, H, W]")
    with eval_mode(model):
        targets, maps, per_batch = [], [], []
        given = None if target is None else targets_for(images.shape[0], target, torch.device("cpu"))
        for start in range(0, images.shape[0], batch_size):
            x = on_model(model, images[start : start + batch_size])
            tgt = resolve_target(model, x, None if given is None else given[start : start + batch_size])
            found = relevance_map(model, x, method, tgt, first_image=start, seed=seed, settings=settings)
            mask = masks[start : start + batch_size]
            per_batch.append(score_maps(model, x, mask, found, tgt, tolerance=tolerance, batch_size=batch_size))
            targets.append(tgt)
            if start < mprt_images:
                maps.append(found[: mprt_images - start])
        joined = {k: torch.cat([b[k] for b in per_batch]) for k in per_batch[0] if "fractions" not in k}
        blocks, mprt = [], torch.zeros(0, 0)
        if mprt_images > 0:
            first = min(mprt_images, images.shape[0])
            chosen = torch.cat(targets)[:first]
            blocks, mprt = mprt_correlations(
                model,
                images[:first],
                method,
                chosen,
                torch.cat(maps),
                seed=seed,
                batch_size=batch_size,
                settings=settings,
            )
    curve_names = ("positive", "negative", "deletion", "insertion")
    return MethodEvaluation(
        method=method,
        target=torch.cat(targets),
        scores={k: v for k, v in joined.items() if k not in curve_names},
        curves={k: joined[k] for k in curve_names},
        fractions={
            "perturbation": per_batch[0]["perturbation_fractions"],
            "deletion": per_batch[0]["deletion_fractions"],
        },
        mprt_blocks=blocks,
        mprt=mprt,
    )


def evaluation_table(results: dict[str, MethodEvaluation]) -> dict[str, dict[str, float]]:
    """Methods x metrics: each method's summary."""
    return {method: result.summary() for method, result in results.items()}
