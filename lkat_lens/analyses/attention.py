"""Attention matrices of every block, class-token maps and attention rollout, for GLA and softmax models alike.

Every attention layer exposes its pattern as the hook point `blocks.{i}.attn.hook_pattern` [B,H,T,T]: softmax
probabilities (rbfKAT, ViT-5, timm ViT) or, for a GLA block, its exact implicit attention
A[t, s] = scale * sum_k q_t[k] k_s[k] exp(G_t[k] - G_s[k]) for s <= t (G the cumulative log gate), which is
causal and signed, with rows that need not sum to 1. While hooked, a layer computes its output as pattern @ v
(equal to the fused kernels up to float rounding), so the pattern is in the autograd graph. The class token is
last in LKAT/rbfKAT and first in ViT-5/timm ViT: positions always come from `model.token_layout`.

Rollout (Abnar & Zuidema; Chefer et al. for the gradient-weighted form): per block M = rownorm(I + Ā), with
Ā the head mean of |A| ("attention") or of (∂y_c/∂A ⊙ A)^+ ("gradient"), and the rollout is M_L ⋯ M_1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lkat_lens.models.hooks import HookedModel, HookPoint

from .batching import on_model
from .parts import attention_kinds, class_token_index, patch_grid, targets_for
from .tokens import layout_dict

METHODS = ("attention", "gradient")


def _pattern_name(block: int) -> str:
    return f"blocks.{block}.attn.hook_pattern"


def _patterns(
    model: HookedModel,
    images: torch.Tensor,
    blocks: list[int],
    keep: Callable[[torch.Tensor], torch.Tensor] = lambda pattern: pattern,
) -> list[torch.Tensor]:
    """`keep` of each selected block's attention pattern, in block order, from one forward without gradients."""
    names = [_pattern_name(i) for i in blocks]
    found: dict[str, torch.Tensor] = {}

    def record(pattern: torch.Tensor, hook: HookPoint) -> None:
        found[hook.name] = keep(pattern)

    with torch.no_grad(), model.hooks(fwd_hooks=[(set(names).__contains__, record)]):
        model(on_model(model, images))
    return [found[n] for n in names]


def _select_blocks(model: HookedModel, blocks: Sequence[int] | None) -> tuple[list[int], list[str]]:
    """Requested block indices (all by default) and their kinds."""
    kinds = attention_kinds(model)
    chosen = list(range(len(kinds))) if blocks is None else list(blocks)
    return chosen, [kinds[i] for i in chosen]


def _selection_dict(result: AttentionMatrices | ClsAttention) -> dict[str, Any]:
    """The JSON entries saying which blocks a result covers and where its tokens sit."""
    return {
        "blocks": result.blocks,
        "kinds": result.kinds,
        "layout": layout_dict(result.layout),
        "grid_size": list(result.grid_size),
    }


@dataclass
class AttentionMatrices:
    """Attention matrix of each selected block: GLA implicit attention or softmax probabilities."""

    matrices: torch.Tensor  # [L, B, H, T, T] fp32 (fp64 for an fp64 GLA model), row = query token, column = key token
    blocks: list[int]
    kinds: list[str]  # per selected block
    layout: dict[str, slice]
    grid_size: tuple[int, int]

    @property
    def cls_index(self) -> int:
        """Position of the class token."""
        return self.layout["cls"].start

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: the class-token row per block and head, averaged over images."""
        return {
            **_selection_dict(self),
            "shape": list(self.matrices.shape),
            "cls_row_mean": self.matrices[..., self.cls_index, :].mean(1).tolist(),
        }


def attention_matrices(
    model: HookedModel, images: torch.Tensor, blocks: Sequence[int] | None = None
) -> AttentionMatrices:
    """Full attention matrices [L, B, H, T, T] of the selected blocks (all by default), from one forward."""
    blocks, kinds = _select_blocks(model, blocks)
    return AttentionMatrices(
        matrices=torch.stack(_patterns(model, images, blocks)),
        blocks=blocks,
        kinds=kinds,
        layout=model.token_layout,
        grid_size=patch_grid(model),
    )


@dataclass
class ClsAttention:
    """The class token's attention row of each selected block: what the class token reads."""

    rows: torch.Tensor  # [L, B, H, T] fp32 (fp64 for an fp64 GLA model)
    blocks: list[int]
    kinds: list[str]
    layout: dict[str, slice]
    grid_size: tuple[int, int]

    @property
    def patch_maps(self) -> torch.Tensor:
        """Weights on the patches over the patch grid [L, B, H, gh, gw]."""
        return self.rows[..., self.layout["patches"]].unflatten(-1, self.grid_size)

    @property
    def registers(self) -> torch.Tensor:
        """Weights on the registers [L, B, H, R] (R = 0 without registers)."""
        return self.rows[..., self.layout.get("registers", slice(0, 0))]

    @property
    def self_weight(self) -> torch.Tensor:
        """Weight of the class token on itself [L, B, H]."""
        return self.rows[..., self.layout["cls"].start]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary averaged over images: patch maps, register and self weights per block and head."""
        return {
            **_selection_dict(self),
            "patch_maps": self.patch_maps.mean(1).tolist(),
            "registers": self.registers.mean(1).tolist(),
            "self": self.self_weight.mean(1).tolist(),
        }


def cls_attention(model: HookedModel, images: torch.Tensor, blocks: Sequence[int] | None = None) -> ClsAttention:
    """Class-token attention rows [L, B, H, T] of the selected blocks (only the rows are kept)."""
    blocks, kinds = _select_blocks(model, blocks)
    layout = model.token_layout
    cls = class_token_index(model)
    rows = _patterns(model, images, blocks, keep=lambda pattern: pattern[..., cls, :].clone())
    return ClsAttention(rows=torch.stack(rows), blocks=blocks, kinds=kinds, layout=layout, grid_size=patch_grid(model))


def rollout(attention: torch.Tensor, gradients: torch.Tensor | None = None) -> torch.Tensor:
    """Rollout [B, T, T] of per-block attention [L, B, H, T, T] (first block first): M_L ⋯ M_1, M = rownorm(I + Ā)."""
    relevance = attention.abs() if gradients is None else (gradients * attention).clamp(min=0)
    fused = relevance.mean(2)
    eye = torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
    joint = eye.expand_as(fused[0])
    for a in fused:
        m = a + eye
        joint = (m / m.sum(-1, keepdim=True)) @ joint
    return joint


@dataclass
class AttentionGradients:
    """Every block's attention matrix and the gradient of the target logit with respect to it."""

    attention: torch.Tensor  # [L, B, H, T, T] fp32 (fp64 for an fp64 GLA model)
    gradients: torch.Tensor  # [L, B, H, T, T] ∂ logits[b, target[b]] / ∂A
    logits: torch.Tensor  # [B, C]
    target: torch.Tensor  # [B] class index per image

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: targets, their logits and the head-summed relevance (∇A ⊙ A)^+ per block."""
        relevance = (self.gradients * self.attention).clamp(min=0).sum((2, 3, 4))
        return {
            "target": self.target.tolist(),
            "target_logit": self.logits.gather(1, self.target[:, None])[:, 0].tolist(),
            "relevance_per_block": relevance.T.tolist(),
        }


def attention_gradients(
    model: HookedModel, images: torch.Tensor, target: int | torch.Tensor | None = None
) -> AttentionGradients:
    """Attention matrices of all blocks and ∂ logit_target / ∂A, from one forward and backward through hook_pattern."""
    names = [_pattern_name(i) for i in range(len(attention_kinds(model)))]
    inputs = on_model(model, images).detach().requires_grad_(True)
    logits, cache = model.run_with_cache(inputs, names=names, grad=True)
    patterns = [cache[n] for n in names]
    chosen = logits.argmax(-1) if target is None else targets_for(logits.shape[0], target, logits.device)
    grads = torch.autograd.grad(logits.gather(1, chosen[:, None]).sum(), patterns)
    return AttentionGradients(
        attention=torch.stack([a.detach() for a in patterns]),
        gradients=torch.stack(grads),
        logits=logits.detach(),
        target=chosen,
    )


@dataclass
class Rollout:
    """Attention rollout through all blocks; row t says how much each input token contributes to token t."""

    joint: torch.Tensor  # [B, T, T]
    method: str
    target: torch.Tensor | None  # [B] for method "gradient"
    layout: dict[str, slice]
    grid_size: tuple[int, int]

    @property
    def cls_row(self) -> torch.Tensor:
        """The class token's row [B, T]."""
        return self.joint[:, self.layout["cls"].start]

    @property
    def cls_map(self) -> torch.Tensor:
        """The class token's row on the patches, over the patch grid [B, gh, gw]."""
        return self.cls_row[:, self.layout["patches"]].unflatten(-1, self.grid_size)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: method, targets, the class-token row and its patch map per image."""
        return {
            "method": self.method,
            "target": None if self.target is None else self.target.tolist(),
            "layout": layout_dict(self.layout),
            "grid_size": list(self.grid_size),
            "cls_row": self.cls_row.tolist(),
            "cls_map": self.cls_map.tolist(),
        }


def attention_rollout(
    model: HookedModel,
    images: torch.Tensor,
    method: str = "attention",
    target: int | torch.Tensor | None = None,
) -> Rollout:
    """Rollout of all blocks: "attention" (head mean of |A|) or "gradient" (Chefer: (∇A ⊙ A)^+ for `target`)."""
    if method not in METHODS:
        raise ValueError(f"unknown rollout method {method!r}; expected one of {METHODS}")
    class_token_index(model)  # the rollout is read on the class token's row
    if method == "attention":
        joint, chosen = rollout(attention_matrices(model, images).matrices), None
    else:
        grads = attention_gradients(model, images, target)
        joint, chosen = rollout(grads.attention, grads.gradients), grads.target
    return Rollout(joint=joint, method=method, target=chosen, layout=model.token_layout, grid_size=patch_grid(model))
