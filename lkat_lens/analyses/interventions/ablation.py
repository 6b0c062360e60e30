"""Ablations with controls: knock out one unit of a hook point (a head, a position, a channel) four ways and
report all four, since zero-ablation alone overstates how much the model depends on a unit (it moves the
activation off its distribution): "zero", "mean" (the unit's mean over a reference set), "noise" (Gaussian noise
with the activation's norm, unit by unit) and "resample" (the unit's activation on another image)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..batching import full_fp32, on_model
from ..parts import TargetLike, eval_mode
from ..serialize import json_ready
from .patching import PATCH_AXES
from .sweep import POINTS, LogitMetric, default_rows, hook_names, sweep_units, swept_units, unit_dim

__all__ = ["ABLATIONS", "AblationResult", "ablate", "ablation_replacements", "norm_matched_noise", "resample_indices"]

ABLATIONS = ("zero", "mean", "noise", "resample")


@dataclass
class AblationResult:
    """One hook point of each block ablated unit by unit, each way of ABLATIONS. `ablated[method, block, unit]` is
    the metric with that unit ablated (mean over the images), `effect` = ablated - clean_metric (negative: the
    unit helped the target). axes = ("method", "block", along)."""

    point: str
    hook: str
    axes: tuple[str, str, str]
    methods: tuple[str, ...]
    ablated: torch.Tensor
    effect: torch.Tensor
    clean_metric: float
    metric: str
    target: torch.Tensor
    foil: torch.Tensor | None
    blocks: list[int]
    units: list[int]
    reference_size: int
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return json_ready(self)

    def method(self, name: str) -> torch.Tensor:
        """The effect [block, unit] of one ablation method."""
        return self.effect[self.methods.index(name)]


def norm_matched_noise(activation: torch.Tensor, dim: int, generator: torch.Generator) -> torch.Tensor:
    """Gaussian noise shaped like `activation` [B, ...], rescaled so that each unit (each index of `dim`, per
    input) has the activation's own L2 norm there."""
    noise = torch.randn(activation.shape, generator=generator, dtype=torch.float64).to(activation.device)
    over = [d for d in range(1, activation.dim()) if d != dim]
    norm = activation.double().norm(dim=over, keepdim=True)
    return (noise * norm / noise.norm(dim=over, keepdim=True)).to(activation.dtype)


def resample_indices(batch: int, reference: int, generator: torch.Generator, same: bool) -> torch.Tensor:
    """For each input, the reference image whose activation replaces its own: seeded, and never the input itself
    when the reference set is the inputs (`same`)."""
    if same:
        if reference < 2:
            raise ValueError("resample ablation needs another image: pass a reference set or at least 2 images")
        return (torch.arange(batch) + 1 + torch.randint(reference - 1, (batch,), generator=generator)) % reference
    return torch.randint(reference, (batch,), generator=generator)


def ablation_replacements(
    activation: torch.Tensor, reference: torch.Tensor, dim: int, generator: torch.Generator, same: bool
) -> dict[str, torch.Tensor]:
    """What each ablation puts in place of an activation [B, ...], given the reference set's activations [R, ...]."""
    return {
        "zero": torch.zeros_like(activation),
        "mean": reference.mean(0, keepdim=True).expand_as(activation),
        "noise": norm_matched_noise(activation, dim, generator),
        "resample": reference[resample_indices(len(activation), len(reference), generator, same).to(reference.device)],
    }


def ablate(
    model: nn.Module,
    images: torch.Tensor,
    point: str = "heads",
    along: str | None = None,
    *,
    reference: torch.Tensor | None = None,
    methods: Sequence[str] = ABLATIONS,
    blocks: Sequence[int] | None = None,
    units: Sequence[int] | None = None,
    target: TargetLike = None,
    foil: TargetLike = None,
    metric: str = "logit_diff",
    seed: int = 0,
    rows_per_pass: int | None = None,
) -> AblationResult:
    """Ablate `point` (a sweep.POINTS name) of each of `blocks` unit by unit along `along` (PATCH_AXES[point] by
    default) on images [B,C,H,W], each way of `methods`. `reference`: images whose activations give the mean and
    the resampled values (default: the images themselves, each resampled from another). target: default the
    predicted class; "logit_diff" subtracts the foil (default: the runner-up class)."""
    unknown = [m for m in methods if m not in ABLATIONS]
    if unknown or not methods:
        raise ValueError(f"unknown ablation methods {unknown}; choose from {ABLATIONS}")
    along = along or PATCH_AXES.get(point, "position")
    names = hook_names(model, point, blocks)
    images = on_model(model, images if images.dim() == 4 else images[None])
    same = reference is None
    generator = torch.Generator().manual_seed(seed)
    with eval_mode(model), torch.no_grad(), full_fp32():
        logits, cache = model.run_with_cache(images, names_filter=names)
        ref_cache = cache if same else model.run_with_cache(on_model(model, reference), names_filter=names)[1]
        scorer = LogitMetric.for_run(metric, logits, logits, target, foil)
        dim = unit_dim(cache[names[0]], along)
        units = swept_units(cache[names[0]], along, units)
        rows_per_pass = rows_per_pass or default_rows(model, cache[names[0]])
        per_method = {m: {} for m in methods}
        for name in names:
            replacements = ablation_replacements(cache[name], ref_cache[name], dim, generator, same)
            for m in methods:
                per_method[m][name] = replacements[m]
        ablated = torch.stack(
            [sweep_units(model, images, per_method[m], along, units, scorer, rows_per_pass) for m in methods]
        )
        clean_value = scorer(logits).mean().item()
    ablated = ablated.mean(-1).double().cpu()
    return AblationResult(
        point=point,
        hook=f"blocks.{{block}}.{POINTS[point]}",
        axes=("method", "block", along),
        methods=tuple(methods),
        ablated=ablated,
        effect=ablated - clean_value,
        clean_metric=clean_value,
        metric=scorer.name,
        target=scorer.target.cpu(),
        foil=None if scorer.foil is None else scorer.foil.cpu(),
        blocks=[int(n.split(".")[1]) for n in names],
        units=units,
        reference_size=len(ref_cache[names[0]]),
        seed=seed,
    )
