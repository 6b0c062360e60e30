"""Input attributions through captum, their pixel and patch maps, and deletion/insertion faithfulness curves.

Methods (captum classes, not re-implemented): "integrated_gradients" (IntegratedGradients), "saliency"
(Saliency; captum's default abs=True gives |grad|), "input_x_gradient" (InputXGradient), "gradient_shap"
(GradientShap), "occlusion" (Occlusion; default window = one patch, stride = one patch) and "smoothgrad"
(NoiseTunnel with nt_type "smoothgrad" over Saliency, or over Integrated Gradients with smooth_over=...).

Baselines live in the model's input space. Images are normalised, so the default baseline, zeros, is the
dataset mean image. Pixel maps reduce [B, C, H, W] over channels: "sum" keeps the sign, so a pixel map of
Integrated Gradients still sums to f(x) - f(baseline); "abs_sum" sums magnitudes. Patch maps [B, gh, gw]
sum the pixel map over each patch, so they sum to the same total.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torchvision.transforms.functional import gaussian_blur

from . import parts
from .parts import TargetLike, eval_mode, pair, resolve_target

if TYPE_CHECKING:
    from types import ModuleType

METHODS = ("integrated_gradients", "saliency", "input_x_gradient", "gradient_shap", "occlusion", "smoothgrad")
REDUCTIONS = ("sum", "abs_sum")
REPLACEMENTS = ("blur", "zeros", "mean")
SMOOTHGRAD_NOISE = 0.15  # SmoothGrad's noise level: stdev as a fraction of the batch's value range
IG_TOLERANCE = 0.05  # Integrated Gradients converged: |delta| <= 5 % of |f(x) - f(baseline)| for every image
IG_STEPS = (32, 1024)  # adaptive IG: start here, double until converged or at the maximum
IMAGES_PER_PASS = 64  # default cap on images per forward/backward pass (IG path points, noise samples, occlusions)


@dataclass
class Attribution:
    """One method's attributions for a batch: raw [B,C,H,W], pixel map [B,H,W] and patch map [B,gh,gw]."""

    method: str
    target: torch.Tensor
    attributions: torch.Tensor
    pixel_map: torch.Tensor
    patch_map: torch.Tensor
    patch_size: tuple[int, int]
    reduction: str
    convergence_delta: torch.Tensor | None = None
    delta_ratio: torch.Tensor | None = None  # IG: |delta| / |f(x) - f(baseline)| per image
    steps: int | None = None  # IG: path steps used
    converged: bool | None = None  # IG: every image within IG_TOLERANCE

    def to_dict(self, pixels: bool = True) -> dict[str, Any]:
        """JSON-friendly summary: maps as nested lists (the raw [B,C,H,W] tensor is left out)."""
        out: dict[str, Any] = {
            "method": self.method,
            "target": self.target.tolist(),
            "reduction": self.reduction,
            "patch_size": list(self.patch_size),
            "patch_map": self.patch_map.tolist(),
            "total": self.pixel_map.sum((1, 2)).tolist(),
            "convergence_delta": None if self.convergence_delta is None else self.convergence_delta.tolist(),
        }
        if self.method == "integrated_gradients":
            out |= {
                "delta_ratio": None if self.delta_ratio is None else self.delta_ratio.tolist(),
                "steps": self.steps,
                "converged": self.converged,
                "convergence_rule": f"|delta| <= {IG_TOLERANCE:g} |f(x) - f(baseline)| for every image",
            }
        if pixels:
            out["pixel_map"] = self.pixel_map.tolist()
        return out


@dataclass
class FaithfulnessCurves:
    """Target-class probability as the most-attributed units are deleted from / inserted into the images."""

    target: torch.Tensor
    unit: str
    replacement: str
    fractions: torch.Tensor
    deletion: torch.Tensor
    insertion: torch.Tensor
    deletion_auc: torch.Tensor
    insertion_auc: torch.Tensor

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly copy (lists of floats)."""
        return {
            "target": self.target.tolist(),
            "unit": self.unit,
            "replacement": self.replacement,
            "fractions": self.fractions.tolist(),
            "deletion": self.deletion.tolist(),
            "insertion": self.insertion.tolist(),
            "deletion_auc": self.deletion_auc.tolist(),
            "insertion_auc": self.insertion_auc.tolist(),
        }


def _model_input(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The images on the model's device and in its floating dtype."""
    param = next(model.parameters())
    return images.detach().to(param.device, param.dtype)


def _baseline(images: torch.Tensor, baselines: torch.Tensor | float | None) -> torch.Tensor:
    """A baseline batch [N,C,H,W] (N = 1 or more) in the images' dtype; None means zeros (the dataset mean)."""
    if baselines is None:
        return torch.zeros_like(images[:1])
    base = torch.as_tensor(baselines, dtype=images.dtype, device=images.device)
    if base.dim() == 0:
        return torch.full_like(images[:1], base.item())
    if base.dim() == 3:
        base = base.unsqueeze(0)
    if base.shape[1:] != images.shape[1:]:
        raise ValueError(f"baselines {tuple(base.shape)} do not match images {tuple(images.shape)}")
    return base


def pixel_map(attributions: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """[B,C,H,W] attributions -> [B,H,W] by summing channels ("sum") or their absolute values ("abs_sum")."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; choose from {REDUCTIONS}")
    return (attributions.abs() if reduction == "abs_sum" else attributions).sum(1)


def patch_map(pixels: torch.Tensor, patch_size: int | tuple[int, int]) -> torch.Tensor:
    """[B,H,W] pixel scores -> [B, H/ph, W/pw] sums over each patch."""
    ph, pw = pair(patch_size)
    b, h, w = pixels.shape
    if h % ph or w % pw:
        raise ValueError(f"image {h}x{w} is not a whole number of {ph}x{pw} patches")
    return pixels.reshape(b, h // ph, ph, w // pw, pw).sum((2, 4))


def _captum() -> ModuleType:
    """captum.attr, imported on first use (it takes about half a second to import)."""
    import captum.attr

    return captum.attr


def _per_pass(images: torch.Tensor) -> int:
    """How many copies of the batch fit in one pass of IMAGES_PER_PASS images (at least one)."""
    return max(1, IMAGES_PER_PASS // images.shape[0])


def _integrated_gradients(model, images, target, baselines, kwargs):
    kwargs = {"internal_batch_size": _per_pass(images) * images.shape[0], **kwargs}
    return (
        _captum()
        .IntegratedGradients(model)
        .attribute(images, baselines=baselines, target=target, return_convergence_delta=True, **kwargs)
    )


def _adaptive_integrated_gradients(model, images, target, baselines, kwargs):
    """IG with `n_steps` if given, else doubled from IG_STEPS[0] until |delta| <= IG_TOLERANCE·|f(x) - f(baseline)|
    for every image (or IG_STEPS[1] is reached); returns attributions, delta, that ratio and the steps used."""
    with torch.no_grad():
        rows = torch.arange(images.shape[0], device=images.device)
        gap = model(images)[rows, target] - model(baselines).expand(images.shape[0], -1)[rows, target]
    steps = kwargs.get("n_steps", IG_STEPS[0])
    while True:
        raw, delta = _integrated_gradients(model, images, target, baselines, {**kwargs, "n_steps": steps})
        ratio = (delta.detach().abs() / gap.abs()).nan_to_num(nan=0.0, posinf=math.inf)
        if "n_steps" in kwargs or steps >= IG_STEPS[1] or bool((ratio <= IG_TOLERANCE).all()):
            return raw, delta, ratio.cpu(), steps
        steps *= 2


def _gradient_shap(model, images, target, baselines, kwargs):
    return (
        _captum()
        .GradientShap(model)
        .attribute(images, baselines=baselines, target=target, return_convergence_delta=True, **kwargs)
    )


def _saliency(model, images, target, baselines, kwargs):
    return _captum().Saliency(model).attribute(images.requires_grad_(), target=target, **kwargs), None


def _input_x_gradient(model, images, target, baselines, kwargs):
    return _captum().InputXGradient(model).attribute(images.requires_grad_(), target=target, **kwargs), None


def _occlusion(model, images, target, baselines, kwargs, patch_size):
    window = (images.shape[1], *patch_size)
    kwargs = {"sliding_window_shapes": window, "strides": window, "perturbations_per_eval": _per_pass(images), **kwargs}
    return _captum().Occlusion(model).attribute(images, baselines=baselines, target=target, **kwargs), None


def _smoothgrad(model, images, target, baselines, kwargs):
    kwargs = dict(kwargs)
    over = kwargs.pop("smooth_over", "saliency")
    if over not in ("saliency", "integrated_gradients"):
        raise ValueError(f"smooth_over must be 'saliency' or 'integrated_gradients', got {over!r}")
    kwargs.setdefault("nt_samples", 16)
    kwargs.setdefault("stdevs", SMOOTHGRAD_NOISE * (images.max() - images.min()).item())
    attr = _captum()
    if over == "integrated_gradients":  # one noisy batch at a time, its IG path split into passes
        tunnel = attr.NoiseTunnel(attr.IntegratedGradients(model))
        kwargs = {"nt_samples_batch_size": 1, "internal_batch_size": _per_pass(images) * images.shape[0]} | kwargs
        kwargs["baselines"] = baselines
    else:
        tunnel = attr.NoiseTunnel(attr.Saliency(model))
        kwargs.setdefault("nt_samples_batch_size", _per_pass(images))
    return tunnel.attribute(images, nt_type="smoothgrad", target=target, **kwargs), None


_RUNNERS = {
    "integrated_gradients": _integrated_gradients,
    "saliency": _saliency,
    "input_x_gradient": _input_x_gradient,
    "gradient_shap": _gradient_shap,
    "smoothgrad": _smoothgrad,
}


def attribute(
    model: nn.Module,
    images: torch.Tensor,
    method: str = "integrated_gradients",
    target: TargetLike = None,
    *,
    baselines: torch.Tensor | float | None = None,
    reduction: str = "sum",
    patch_size: int | tuple[int, int] | None = None,
    **method_kwargs: Any,
) -> Attribution:
    """Attribute the target-class logit (default: the predicted class) to the input pixels with one captum method.

    `method_kwargs` go to the captum method's `attribute` (e.g. n_steps, internal_batch_size for IG;
    n_samples, stdevs for GradientShap; sliding_window_shapes, strides, perturbations_per_eval for Occlusion;
    nt_samples, stdevs, nt_samples_batch_size, smooth_over for SmoothGrad). Passes hold about IMAGES_PER_PASS
    images unless those arguments say otherwise. The model runs in eval mode; its training flag is restored.
    """
    if method not in METHODS:
        raise ValueError(f"unknown attribution method {method!r}; choose from {METHODS}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; choose from {REDUCTIONS}")
    size = parts.patch_size(model) if patch_size is None else pair(patch_size)
    with eval_mode(model):
        x = _model_input(model, images)
        tgt = resolve_target(model, x, target)
        base = _baseline(x, baselines)
        steps = ratio = None
        if method == "occlusion":
            raw, delta = _occlusion(model, x, tgt, base, method_kwargs, size)
        elif method == "integrated_gradients":
            raw, delta, ratio, steps = _adaptive_integrated_gradients(model, x, tgt, base, method_kwargs)
        else:
            raw, delta = _RUNNERS[method](model, x, tgt, base, method_kwargs)
    raw = raw.detach()
    pixels = pixel_map(raw, reduction)
    return Attribution(
        method=method,
        target=tgt,
        attributions=raw,
        pixel_map=pixels,
        patch_map=patch_map(pixels, size),
        patch_size=size,
        reduction=reduction,
        convergence_delta=None if delta is None else delta.detach(),
        delta_ratio=ratio,
        steps=steps,
        converged=None if ratio is None else bool((ratio <= IG_TOLERANCE).all()),
    )


def blurred(images: torch.Tensor, sigma: float) -> torch.Tensor:
    """Gaussian-blurred copies of images [B,C,H,W] (kernel of about 3 sigma each side, within the image size)."""
    limit = 2 * min(images.shape[-2:]) - 1
    size = min(2 * math.ceil(3 * sigma) + 1, limit if limit % 2 else limit - 1)
    return gaussian_blur(images, [size, size], [sigma, sigma])


def replacement_images(images: torch.Tensor, replacement: str | torch.Tensor, sigma: float) -> torch.Tensor:
    """What deleted units are replaced with: "blur", "zeros" (the mean image), "mean" (per-image channel mean)."""
    if isinstance(replacement, torch.Tensor):
        return replacement.to(images).expand_as(images)
    if replacement == "blur":
        return blurred(images, sigma)
    if replacement == "zeros":
        return torch.zeros_like(images)
    if replacement == "mean":
        return images.mean((2, 3), keepdim=True).expand_as(images)
    raise ValueError(f"unknown replacement {replacement!r}; choose from {REPLACEMENTS} or pass a tensor")


def curve_auc(fractions: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Area under curves values[..., S] over fractions [S] by the trapezoid rule."""
    return torch.trapezoid(values, fractions, dim=-1)


def _unit_scores(
    scores: Attribution | torch.Tensor, unit: str, image_hw: tuple[int, int], patch_size: tuple[int, int]
) -> torch.Tensor:
    """Per-unit scores [B, n] (n pixels or patches) from an Attribution or a [B,H,W] / [B,gh,gw] map."""
    if isinstance(scores, Attribution):
        chosen = scores.patch_map if unit == "patch" else scores.pixel_map
        return chosen.flatten(1)
    grid = (image_hw[0] // patch_size[0], image_hw[1] // patch_size[1])
    if tuple(scores.shape[1:]) == image_hw:
        return (patch_map(scores, patch_size) if unit == "patch" else scores).flatten(1)
    if tuple(scores.shape[1:]) == grid and unit == "patch":
        return scores.flatten(1)
    raise ValueError(f"scores {tuple(scores.shape)} are neither a pixel map {image_hw} nor a patch map {grid}")


def _step_masks(
    order_rank: torch.Tensor, counts: list[int], unit_shape: tuple[int, int], repeat: tuple[int, int]
) -> torch.Tensor:
    """Pixel masks [len(counts), B, 1, H, W]: True on units ranked below each count in their image."""
    masks = torch.stack([order_rank < c for c in counts]).unflatten(-1, unit_shape)
    return masks.repeat_interleave(repeat[0], -2).repeat_interleave(repeat[1], -1).unsqueeze(2)


def _curve(
    model: nn.Module,
    images: torch.Tensor,
    fill: torch.Tensor,
    rank: torch.Tensor,
    counts: list[int],
    layout: tuple[tuple[int, int], tuple[int, int]],
    target: torch.Tensor,
    insert: bool,
    batch_size: int,
) -> torch.Tensor:
    """Target-class softmax probability [B, S] after deleting (or inserting) the first counts[s] units."""
    b = images.shape[0]
    per_forward = max(1, batch_size // b)
    probs = []
    for start in range(0, len(counts), per_forward):
        group = counts[start : start + per_forward]
        masks = _step_masks(rank, group, *layout)
        batch = torch.where(masks, images, fill) if insert else torch.where(masks, fill, images)
        p = model(batch.flatten(0, 1)).softmax(-1)
        probs.append(p.gather(1, target.repeat(len(group)).unsqueeze(1)).reshape(len(group), b))
    return torch.cat(probs).T


def deletion_insertion(
    model: nn.Module,
    images: torch.Tensor,
    attribution: Attribution | torch.Tensor,
    steps: int = 16,
    *,
    unit: str = "patch",
    replacement: str | torch.Tensor = "blur",
    target: TargetLike = None,
    patch_size: int | tuple[int, int] | None = None,
    blur_sigma: float | None = None,
    batch_size: int = 64,
) -> FaithfulnessCurves:
    """Deletion and insertion curves of the target-class probability, units taken in order of attribution.

    Deletion replaces the top-k units of each image (pixels or patches, highest score first) with the
    replacement; insertion starts from the replacement and puts the top-k units back, for k = round(s n / steps),
    s = 0..steps. AUC over the fraction of units: a faithful map gives low deletion and high insertion AUC.
    `attribution` is an Attribution (its target is the default) or a [B,H,W] pixel / [B,gh,gw] patch map.
    The blur sigma defaults to the patch width.
    """
    if unit not in ("patch", "pixel"):
        raise ValueError(f"unit must be 'patch' or 'pixel', got {unit!r}")
    if isinstance(attribution, Attribution) and patch_size is None:
        size = attribution.patch_size
    else:
        size = parts.patch_size(model) if patch_size is None else pair(patch_size)
    if target is None and isinstance(attribution, Attribution):
        target = attribution.target
    with eval_mode(model), torch.no_grad():
        x = _model_input(model, images)
        tgt = resolve_target(model, x, target)
        h, w = x.shape[-2:]
        scores = _unit_scores(attribution, unit, (h, w), size).to(x.device)
        unit_shape, repeat = ((h // size[0], w // size[1]), size) if unit == "patch" else ((h, w), (1, 1))
        n = scores.shape[1]
        if not 1 <= steps <= n:
            raise ValueError(f"steps must be in [1, {n}] (the number of {unit}es), got {steps}")
        rank = scores.argsort(dim=1, descending=True, stable=True).argsort(dim=1)
        counts = [round(s * n / steps) for s in range(steps + 1)]
        fill = replacement_images(x, replacement, float(size[1]) if blur_sigma is None else blur_sigma)
        layout = (unit_shape, repeat)
        deletion = _curve(model, x, fill, rank, counts, layout, tgt, insert=False, batch_size=batch_size)
        insertion = _curve(model, x, fill, rank, counts, layout, tgt, insert=True, batch_size=batch_size)
    fractions = torch.tensor(counts, dtype=deletion.dtype, device=deletion.device) / n
    return FaithfulnessCurves(
        target=tgt,
        unit=unit,
        replacement=replacement if isinstance(replacement, str) else "tensor",
        fractions=fractions,
        deletion=deletion,
        insertion=insertion,
        deletion_auc=curve_auc(fractions, deletion),
        insertion_auc=curve_auc(fractions, insertion),
    )
