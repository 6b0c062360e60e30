"""The engine under patching and ablation: replace one unit of a hook point's activation (a position, a head, a
channel) with a given value, for many units per forward pass, and read a logit metric.

Each forward pass repeats the B inputs n times; copy k of the batch has unit k of the chunk replaced (so one
pass answers n units), and n is set by a memory budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..parts import TargetLike, kan_layers, targets_for

__all__ = [
    "AXES",
    "MEMORY_BUDGET",
    "POINTS",
    "LogitMetric",
    "default_rows",
    "hook_names",
    "rows_for_budget",
    "sweep_units",
]

# Short names of the hook points an intervention can target -> hook suffix inside blocks.{i}.
POINTS = {
    "resid_pre": "hook_resid_pre",
    "resid_mid": "hook_resid_mid",
    "resid_post": "hook_resid_post",
    "attn_out": "attn.hook_out",
    "heads": "attn.hook_z",
    "q": "attn.hook_q",
    "k": "attn.hook_k",
    "v": "attn.hook_v",
    "gate": "attn.hook_gk",
    "fc1": "mlp.fc1.hook_out",
    "fc2": "mlp.fc2.hook_out",
}
WHAT = {"heads": "per-head attention outputs", "gate": "GLA forget gates", "fc1": "KAN layers", "fc2": "KAN layers"}
# The axis a unit is taken along: per input, activations are [T, D] or [T, H, d].
AXES = ("position", "head", "channel")
MEMORY_BUDGET = {"cuda": 4 * 2**30, "cpu": 2**30}  # bytes of activations per forward pass of a sweep


@dataclass(frozen=True)
class LogitMetric:
    """Per input, the target class's logit minus the foil class's ("logit_diff") or the target's logit alone
    ("logit"). Called on logits [..., B, classes], returns [..., B]."""

    target: torch.Tensor
    foil: torch.Tensor | None = None

    @property
    def name(self) -> str:
        return "logit" if self.foil is None else "logit_diff"

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        value = logits.gather(-1, self.target.expand(logits.shape[:-1])[..., None])[..., 0]
        if self.foil is None:
            return value
        return value - logits.gather(-1, self.foil.expand(logits.shape[:-1])[..., None])[..., 0]

    @classmethod
    def build(
        cls, name: str, target: torch.Tensor, rival_logits: torch.Tensor, foil: torch.Tensor | None = None
    ) -> LogitMetric:
        """The metric `name` ("logit_diff" or "logit"); the foil defaults to the top class of `rival_logits`
        other than the target."""
        classes = rival_logits.shape[-1]
        for given in (target, foil):
            if given is not None and not ((given >= 0) & (given < classes)).all():
                raise ValueError(f"class {given.tolist()} out of range: the model has classes 0..{classes - 1}")
        if name == "logit":
            return cls(target)
        if name != "logit_diff":
            raise ValueError(f"unknown metric {name!r}; choose 'logit_diff' or 'logit'")
        if foil is None:
            foil = rival_logits.scatter(-1, target[:, None], float("-inf")).argmax(-1)
        return cls(target, foil)

    @classmethod
    def for_run(
        cls, name: str, logits: torch.Tensor, rival_logits: torch.Tensor, target: TargetLike, foil: TargetLike
    ) -> LogitMetric:
        """`build` with the target and foil as the analyses take them: the target defaults to the top class of
        `logits` (the unintervened run), the foil to `rival_logits`' top other class."""
        count, device = len(logits), logits.device
        goal = logits.argmax(-1) if target is None else targets_for(count, target, device)
        chosen = None if foil is None else targets_for(count, foil, device)
        return cls.build(name, goal, rival_logits, chosen)


def hook_names(model: nn.Module, point: str, blocks: Sequence[int] | None = None) -> list[str]:
    """The hook point `point` (a POINTS key) of each block, or a clear error naming what the model lacks."""
    if not hasattr(model, "hook_points"):
        raise ValueError(
            f"{type(model).__name__} has no hook points; interventions run on lkat-lens models (LKAT, rbfKAT, "
            "ViT-5) and timm ViTs given hook points (lkat_lens.models.baselines.attach_hook_points)"
        )
    if point not in POINTS:
        raise ValueError(f"unknown hook point {point!r}; choose from {sorted(POINTS)}")
    depth = len(model.blocks)
    blocks = list(range(depth)) if blocks is None else [b + depth if b < 0 else b for b in blocks]
    bad = [b for b in blocks if not 0 <= b < depth]
    if bad:
        raise ValueError(f"blocks {bad} out of range: the model has blocks 0..{depth - 1}")
    names = [f"blocks.{b}.{POINTS[point]}" for b in blocks]
    available = model.hook_points()
    missing = [n for n in names if n not in available]
    if missing:
        what = f" (it has no {WHAT[point]})" if point in WHAT else ""
        raise ValueError(f"{type(model).__name__} has no hook point {missing[0]}{what}; cannot intervene on {point!r}")
    return names


def unit_dim(activation: torch.Tensor, along: str) -> int:
    """The dimension of a batched activation [B, T, ...] that `along` indexes."""
    if along == "position":
        return 1
    if along == "head":
        if activation.dim() != 4:
            raise ValueError(f"'head' needs per-head activations [B, T, H, d]; this one is {tuple(activation.shape)}")
        return 2
    if along == "channel":
        if activation.dim() != 3:
            raise ValueError(f"'channel' needs activations [B, T, D]; this one is {tuple(activation.shape)}")
        return 2
    raise ValueError(f"unknown axis {along!r}; choose from {AXES}")


def swept_units(activation: torch.Tensor, along: str, units: Sequence[int] | None) -> list[int]:
    """The units a sweep visits: the given ones, or every unit of the activation along `along`."""
    return list(range(activation.shape[unit_dim(activation, along)])) if units is None else [int(u) for u in units]


def default_rows(model: nn.Module, activation: torch.Tensor) -> int:
    """Inputs per forward pass for sweeps over a hook point with this activation [B, T, ...], within the device's
    MEMORY_BUDGET."""
    budget = MEMORY_BUDGET["cuda" if activation.device.type == "cuda" else "cpu"]
    return rows_for_budget(model, activation.shape[1], budget)


def rows_for_budget(model: nn.Module, tokens: int, budget: int) -> int:
    """Inputs per forward pass whose activations fit in `budget` bytes (a conservative estimate: a few live
    copies of the widest activation, the KAN basis values [T, in, G] included)."""
    widest = 4 * model.embed_dim
    for layer in kan_layers(model).values():
        widest = max(widest, layer.in_features * layer.num_grids)
    param = next(model.parameters())
    return max(1, budget // (4 * tokens * widest * param.element_size()))


def sweep_units(
    model: nn.Module,
    inputs: torch.Tensor,
    replacements: Mapping[str, torch.Tensor],
    along: str,
    units: Sequence[int],
    metric: Callable[[torch.Tensor], torch.Tensor],
    rows_per_pass: int,
) -> torch.Tensor:
    """For each hook name in `replacements` (value: [B, ...], the activation's shape) and each unit, the metric of
    the inputs [B, C, H, W] run with that one unit replaced: [hooks, units, B]."""
    b = inputs.shape[0]
    per_pass = max(1, rows_per_pass // b)
    out = []
    for name, replacement in replacements.items():
        dim = unit_dim(replacement, along) + 1  # in the [n, B, ...] view
        size = replacement.shape[dim - 1]
        bad = [u for u in units if not 0 <= u < size]
        if bad:
            raise ValueError(f"{along}s {bad} out of range: {name} has {along}s 0..{size - 1}")
        rows = []
        for start in range(0, len(units), per_pass):
            chunk = torch.as_tensor(units[start : start + per_pass], device=inputs.device)
            shape = [len(chunk)] + [1] * replacement.dim()
            shape[dim] = size
            mask = (torch.arange(size, device=inputs.device) == chunk[:, None]).reshape(shape)
            hook = _replace_hook(mask, replacement)
            logits = model.run_with_hooks(inputs.repeat(len(chunk), 1, 1, 1), fwd_hooks=[(name, hook)])
            rows.append(metric(logits.reshape(len(chunk), b, -1)))
        out.append(torch.cat(rows))
    return torch.stack(out)


def _replace_hook(mask: torch.Tensor, replacement: torch.Tensor) -> Callable:
    def hook(tensor: torch.Tensor, _) -> torch.Tensor:
        view = tensor.reshape(mask.shape[0], *replacement.shape)
        return torch.where(mask, replacement.to(tensor.dtype), view).reshape(tensor.shape)

    return hook
