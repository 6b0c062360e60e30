"""Activation patching (TransformerLens's `patching`): run a corrupted input with one unit of a hook point (a
position of the residual stream, a head's output, a channel of a KAN layer) taken from the clean run, and see how
much of the clean logit metric comes back: 0 = as corrupted, 1 = as clean."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..batching import full_fp32, on_model
from ..parts import TargetLike, eval_mode, patch_grid, patch_size, token_positions
from ..serialize import json_ready
from .corruptions import corrupt
from .sweep import POINTS, LogitMetric, default_rows, hook_names, sweep_units, swept_units, unit_dim

__all__ = ["PATCH_AXES", "PatchingResult", "activation_patching", "patch_every_point", "patch_heads", "patch_residual"]

# The axis each hook point is patched along by default (patch_every_point).
PATCH_AXES = {
    "resid_pre": "position",
    "resid_mid": "position",
    "resid_post": "position",
    "attn_out": "position",
    "heads": "head",
    "q": "head",
    "k": "head",
    "v": "head",
    "gate": "head",
    "fc1": "channel",
    "fc2": "channel",
}


@dataclass
class PatchingResult:
    """Patching one hook point of each block, unit by unit. `values[block, unit]` is the normalised metric
    (patched - corrupt) / (clean - corrupt), NaN when clean and corrupt agree; `patched` the metric itself (mean over
    the input pairs). axes = ("block", along); `blocks` and `units` label the rows and columns."""

    point: str
    hook: str
    axes: tuple[str, str]
    values: torch.Tensor
    patched: torch.Tensor
    clean_metric: float
    corrupt_metric: float
    metric: str
    target: torch.Tensor
    foil: torch.Tensor | None
    blocks: list[int]
    units: list[int]
    layout: dict[str, list[int]] = field(default_factory=dict)
    grid: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return json_ready(self)


def activation_patching(
    model: nn.Module,
    clean: torch.Tensor,
    corrupted: torch.Tensor | str,
    point: str = "resid_pre",
    along: str | None = None,
    *,
    blocks: Sequence[int] | None = None,
    units: Sequence[int] | None = None,
    target: TargetLike = None,
    foil: TargetLike = None,
    metric: str = "logit_diff",
    seed: int = 0,
    rows_per_pass: int | None = None,
) -> PatchingResult:
    """Patch `point` (a sweep.POINTS name) of each of `blocks` (all) unit by unit along `along` ("position",
    "head", "channel"; PATCH_AXES[point] by default) from the clean run into the corrupted one.

    clean: images [B,C,H,W] or one [C,H,W]; corrupted: images of the same shape, or a corruption ("noise", "blur",
    "shuffle"; corruptions.corrupt, seeded). target: the class per pair (default: the clean prediction); the metric
    "logit_diff" subtracts the foil's logit (default: the corrupted run's top class other than the target), "logit"
    reads the target's alone. Batched: `rows_per_pass` inputs per forward pass (default from MEMORY_BUDGET).
    """
    along = along or PATCH_AXES.get(point, "position")
    names = hook_names(model, point, blocks)
    clean = on_model(model, clean if clean.dim() == 4 else clean[None])
    if isinstance(corrupted, str):
        corrupted = corrupt(clean, corrupted, patch_size=patch_size(model), seed=seed)
    corrupted = on_model(model, corrupted if corrupted.dim() == 4 else corrupted[None])
    if corrupted.shape[1:] != clean.shape[1:] or len(corrupted) not in (1, len(clean)):
        raise ValueError(f"corrupted images {tuple(corrupted.shape)} do not pair with clean {tuple(clean.shape)}")
    corrupted = corrupted.expand_as(clean)
    with eval_mode(model), torch.no_grad(), full_fp32():
        clean_logits, cache = model.run_with_cache(clean, names_filter=names)
        corrupt_logits = model(corrupted)
        scorer = LogitMetric.for_run(metric, clean_logits, corrupt_logits, target, foil)
        size = cache[names[0]].shape[unit_dim(cache[names[0]], along)]
        units = swept_units(cache[names[0]], along, units)
        rows_per_pass = rows_per_pass or default_rows(model, cache[names[0]])
        patched = sweep_units(model, corrupted, {n: cache[n] for n in names}, along, units, scorer, rows_per_pass)
        clean_value, corrupt_value = scorer(clean_logits).mean().item(), scorer(corrupt_logits).mean().item()
    patched = patched.mean(-1).double().cpu()
    return PatchingResult(
        point=point,
        hook=f"blocks.{{block}}.{POINTS[point]}",
        axes=("block", along),
        values=normalised(patched, clean_value, corrupt_value),
        patched=patched,
        clean_metric=clean_value,
        corrupt_metric=corrupt_value,
        metric=scorer.name,
        target=scorer.target.cpu(),
        foil=None if scorer.foil is None else scorer.foil.cpu(),
        blocks=[int(n.split(".")[1]) for n in names],
        units=units,
        layout=token_positions(model, size) if along == "position" else {},
        grid=patch_grid(model) if along == "position" else None,
    )


def normalised(patched: torch.Tensor, clean: float, corrupt: float) -> torch.Tensor:
    """(patched - corrupt) / (clean - corrupt): 0 = corrupted, 1 = clean; NaN where the two runs agree."""
    gap = clean - corrupt
    if abs(gap) <= 1e-6 * max(abs(clean), abs(corrupt), 1.0):
        return torch.full_like(patched, float("nan"))
    return (patched - corrupt) / gap


def patch_residual(
    model: nn.Module, clean: torch.Tensor, corrupted: torch.Tensor | str, point: str = "resid_pre", **kwargs: Any
) -> PatchingResult:
    """The residual stream (`point`: resid_pre, resid_mid or resid_post) patched per [block, position]."""
    if not point.startswith("resid_"):
        raise ValueError(f"patch_residual patches resid_pre, resid_mid or resid_post, not {point!r}")
    return activation_patching(model, clean, corrupted, point, "position", **kwargs)


def patch_heads(
    model: nn.Module, clean: torch.Tensor, corrupted: torch.Tensor | str, point: str = "heads", **kwargs: Any
) -> PatchingResult:
    """Per-head activations (`point`: heads = each head's output before the output projection, or q, k, v, gate)
    patched per [block, head] at every position."""
    return activation_patching(model, clean, corrupted, point, "head", **kwargs)


def patch_every_point(
    model: nn.Module, clean: torch.Tensor, corrupted: torch.Tensor | str, *, seed: int = 0, **kwargs: Any
) -> dict[str, PatchingResult]:
    """Every hook point of PATCH_AXES the model has (GLA gates only with GLA, KAN channels only with KAN), each
    along its default axis, against the same corrupted input."""
    clean = clean if clean.dim() == 4 else clean[None]
    if isinstance(corrupted, str):
        corrupted = corrupt(on_model(model, clean), corrupted, patch_size=patch_size(model), seed=seed)
    available = model.hook_points()
    return {
        point: activation_patching(model, clean, corrupted, point, **kwargs)
        for point, suffix in POINTS.items()
        if f"blocks.0.{suffix}" in available
    }
