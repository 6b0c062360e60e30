"""Direct logit attribution and the logit lens.

The final residual stream is the embedding plus each block's attention and MLP (KAN) writes, read off the hook
points as differences (resid_mid - resid_pre, resid_post - resid_mid; for blocks without resid_mid, the block's
whole write), so they sum to it exactly. With the final norm's scale frozen at the clean run (LayerNorm: centre,
divide by the clean std, weight; RMSNorm: divide by the clean rms, weight) the norm is linear, and each component's
direct contribution to a class logit is head(norm(component)) without biases; the biases (norm bias through the
head, head bias) are their own term. In float64 the terms sum to the logit to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from timm.layers import RmsNorm
from torch import nn

from ..batching import full_fp32, on_model
from ..parts import TargetLike, eval_mode, residual_names, targets_for
from ..serialize import json_ready

__all__ = ["DirectLogitAttribution", "LogitLens", "direct_logit_attribution", "logit_lens", "readout_weights"]


@dataclass
class DirectLogitAttribution:
    """contributions[image, component, position]: each component's direct effect on the target logit as if the head
    read that position (the class token's column is the model's, for class-token models); `bias[image, position]`
    the biases' part; `logit[image]` their sum over the readout (readout_weights), `model_logit[image]` the model's
    own logit. axes = ("image", "component", "position")."""

    components: list[str]
    contributions: torch.Tensor
    bias: torch.Tensor
    logit: torch.Tensor
    model_logit: torch.Tensor
    target: torch.Tensor
    readout: torch.Tensor
    axes: tuple[str, str, str] = ("image", "component", "position")

    def to_dict(self) -> dict[str, Any]:
        return json_ready(self)

    @property
    def totals(self) -> torch.Tensor:
        """Each component's contribution to the model's logit [image, component] (over the readout positions)."""
        return self.contributions @ self.readout


@dataclass
class LogitLens:
    """The head applied to the residual stream after the embedding and after each block, through the final norm
    (its own scale, as the model would): `logits[image, layer, class]` at the readout, `target_logit[image, layer,
    position]` the target class's logit read at every position. axes = ("image", "layer", "class")."""

    layers: list[str]
    logits: torch.Tensor
    target_logit: torch.Tensor
    target: torch.Tensor
    axes: tuple[str, str, str] = ("image", "layer", "class")

    def to_dict(self) -> dict[str, Any]:
        return json_ready(self)


def readout_weights(model: nn.Module, tokens: int) -> torch.Tensor:
    """What the head reads [tokens] (float64): the class token (1 there), or the mean of the patch tokens."""
    weights = torch.zeros(tokens, dtype=torch.float64)
    layout = model.token_layout
    if "cls" in layout and getattr(model, "global_pool", "token") == "token":
        weights[layout["cls"]] = 1.0
    else:
        patches = range(*layout["patches"].indices(tokens))
        weights[list(patches)] = 1.0 / len(patches)
    return weights


def _check_parts(model: nn.Module) -> tuple[nn.Module, nn.Linear]:
    norm, head = getattr(model, "norm", None), getattr(model, "head", None)
    if not isinstance(norm, nn.LayerNorm | RmsNorm) or not isinstance(head, nn.Linear):
        raise ValueError(
            f"direct logit attribution needs a final LayerNorm or RmsNorm `norm` and a Linear `head`; "
            f"{type(model).__name__} has {type(norm).__name__} and {type(head).__name__}"
        )
    return norm, head


def _frozen_norm(norm: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The clean run's per-token divisor [..., 1] (float64) and whether the norm centres."""
    centre = isinstance(norm, nn.LayerNorm)
    centred = x - x.mean(-1, keepdim=True) if centre else x
    return (centred.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt(), centre


def direct_logit_attribution(
    model: nn.Module, images: torch.Tensor, target: TargetLike = None
) -> DirectLogitAttribution:
    """Each block's attention and MLP contribution (and the embedding's) to the target logit (default: the
    predicted class) through the final norm with its scale frozen at this run; sums to the logit (float64)."""
    norm, head = _check_parts(model)
    images = on_model(model, images if images.dim() == 4 else images[None])
    points = model.hook_points()
    depth = len(model.blocks)
    has_mid = all(f"blocks.{i}.hook_resid_mid" in points for i in range(depth))
    names = ["hook_embed"] + [
        f"blocks.{i}.{p}" for i in range(depth) for p in (("hook_resid_mid",) if has_mid else ()) + ("hook_resid_post",)
    ]
    with eval_mode(model), torch.no_grad(), full_fp32():
        logits, cache = model.run_with_cache(images, names_filter=names)
    goal = logits.argmax(-1) if target is None else targets_for(len(images), target, images.device)
    stream = [cache[n].double().cpu() for n in names]
    components = ["embed"] + [
        f"{kind} {i}" for i in range(depth) for kind in (("attn", "mlp") if has_mid else ("block",))
    ]
    parts = torch.stack([stream[0]] + [b - a for a, b in zip(stream, stream[1:], strict=False)], 1)  # [B,C,T,D]
    scale, centre = _frozen_norm(norm, stream[-1])  # [B,T,1]
    if centre:
        parts = parts - parts.mean(-1, keepdim=True)
    weight = norm.weight.detach().double().cpu() if norm.weight is not None else 1.0
    rows = head.weight.detach().double().cpu()[goal.cpu()]  # [B,D]
    contributions = torch.einsum("bctd,bd->bct", parts / scale[:, None] * weight, rows)
    bias = head.bias.detach().double().cpu()[goal.cpu()][:, None].expand(-1, parts.shape[2]).clone()
    if getattr(norm, "bias", None) is not None:
        bias += (rows @ norm.bias.detach().double().cpu())[:, None]
    readout = readout_weights(model, parts.shape[2])
    return DirectLogitAttribution(
        components=components,
        contributions=contributions,
        bias=bias,
        logit=(contributions.sum(1) + bias) @ readout,
        model_logit=logits.gather(-1, goal[:, None])[:, 0].double().cpu(),
        target=goal.cpu(),
        readout=readout,
    )


def logit_lens(model: nn.Module, images: torch.Tensor, target: TargetLike = None) -> LogitLens:
    """The head through the final norm on the residual stream after the embedding and each block (the last one
    is the model's own logits)."""
    norm, head = _check_parts(model)
    images = on_model(model, images if images.dim() == 4 else images[None])
    names = residual_names(model)
    with eval_mode(model), torch.no_grad(), full_fp32():
        logits, cache = model.run_with_cache(images, names_filter=names)
        goal = logits.argmax(-1) if target is None else targets_for(len(images), target, images.device)
        per_position = torch.stack([head(norm(cache[n])) for n in names], 1).double().cpu()  # [B,L,T,classes]
    readout = readout_weights(model, per_position.shape[2])
    return LogitLens(
        layers=["embed"] + [f"block {i}" for i in range(len(model.blocks))],
        logits=torch.einsum("bltc,t->blc", per_position, readout),
        target_logit=per_position.gather(-1, goal.cpu()[:, None, None, None].expand(*per_position.shape[:3], 1))[
            ..., 0
        ],
        target=goal.cpu(),
    )
