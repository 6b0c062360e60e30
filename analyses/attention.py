"""Attention matrices of every block, class-token maps and attention rollout, for GLA and softmax models alike.

A GLA block has no attention matrix in its forward, but its output is exactly o = A @ v with the implicit
attention A[t, s] = scale * sum_k q_t[k] k_s[k] exp(G_t[k] - G_s[k]) for s <= t (G the cumulative log gate),
computed from the captured hook_q / hook_k / hook_gk. A is causal and signed, and its rows need not sum to 1.
Softmax blocks (rbfKAT, ViT-5, timm ViT) give their probabilities through hook_pattern. The class token is
last in LKAT/rbfKAT and first in ViT-5/timm ViT: positions always come from `model.token_layout`.

Rollout (Abnar & Zuidema; Chefer et al. for the gradient-weighted form): per block M = rownorm(I + Ā), with
Ā the head mean of |A| ("attention") or of (∂y_c/∂A ⊙ A)^+ ("gradient"), and the rollout is M_L ⋯ M_1.

∂y_c/∂A needs A inside the forward graph. `explicit_attention()` makes it so: while it is active, every GLA
call of an LKAT layer (`gated_linear_attention`) and every `F.scaled_dot_product_attention` call runs as
A @ v with A materialised from the layer's own q, k (and gk). This computes the same function as the fused
kernels (outputs agree to float rounding), so the gradients are exact for the model.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from lkat_lens.kernels.gla import implicit_attention, implicit_attention_row
from lkat_lens.models import attention as attention_layers
from lkat_lens.models.hooks import ActivationCache, HookedModel

from .tokens import layout_dict

METHODS = ("attention", "gradient")


def attention_kinds(model: HookedModel) -> list[str]:
    """Per block, "gla" (GLA layer: hook_gk) or "softmax" (hook_pattern)."""
    points = model.hook_points()
    kinds = []
    for i in range(len(model.blocks)):
        if f"blocks.{i}.attn.hook_gk" in points:
            kinds.append("gla")
        elif f"blocks.{i}.attn.hook_pattern" in points:
            kinds.append("softmax")
        else:
            raise ValueError(f"block {i} of {type(model).__name__} has no attention hook points (hook_gk/hook_pattern)")
    return kinds


def _hook_names(block: int, kind: str) -> list[str]:
    """Hooks that determine a block's attention matrix."""
    shorts = ("q", "k", "gk") if kind == "gla" else ("pattern",)
    return [f"blocks.{block}.attn.hook_{s}" for s in shorts]


def _gla_inputs(cache: ActivationCache, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Captured (q, k, gk) of a GLA block."""
    return tuple(cache[name] for name in _hook_names(block, "gla"))


def _run(model: HookedModel, images: torch.Tensor, blocks: list[int], kinds: list[str]) -> ActivationCache:
    """One forward caching what the attention of `blocks` needs."""
    names = [n for i in blocks for n in _hook_names(i, kinds[i])]
    return model.run_with_cache(images, names=names)[1]


def _select_blocks(model: HookedModel, blocks: Sequence[int] | None) -> tuple[list[int], list[str]]:
    """Requested block indices (all by default) and every block's kind."""
    kinds = attention_kinds(model)
    return (list(range(len(kinds))) if blocks is None else list(blocks)), kinds


def _grid(model: HookedModel) -> tuple[int, int]:
    return tuple(model.patch_embed.grid_size)


@dataclass
class AttentionMatrices:
    """Attention matrix of each selected block: GLA implicit attention or softmax probabilities."""

    matrices: torch.Tensor  # [L, B, H, T, T] fp32, row = query token, column = key token
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
            "blocks": self.blocks,
            "kinds": self.kinds,
            "layout": layout_dict(self.layout),
            "grid_size": list(self.grid_size),
            "shape": list(self.matrices.shape),
            "cls_row_mean": self.matrices[..., self.cls_index, :].mean(1).tolist(),
        }


def attention_matrices(
    model: HookedModel, images: torch.Tensor, blocks: Sequence[int] | None = None
) -> AttentionMatrices:
    """Full attention matrices [L, B, H, T, T] of the selected blocks (all by default), from one forward."""
    blocks, kinds = _select_blocks(model, blocks)
    cache = _run(model, images, blocks, kinds)
    mats = []
    for i in blocks:
        if kinds[i] == "gla":
            mats.append(implicit_attention(*_gla_inputs(cache, i), scale=model.blocks[i].attn.scale))
        else:
            mats.append(cache[f"blocks.{i}.attn.hook_pattern"].float())
    return AttentionMatrices(
        matrices=torch.stack(mats),
        blocks=blocks,
        kinds=[kinds[i] for i in blocks],
        layout=model.token_layout,
        grid_size=_grid(model),
    )


@dataclass
class ClsAttention:
    """The class token's attention row of each selected block: what the class token reads."""

    rows: torch.Tensor  # [L, B, H, T] fp32
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
            "blocks": self.blocks,
            "kinds": self.kinds,
            "layout": layout_dict(self.layout),
            "grid_size": list(self.grid_size),
            "patch_maps": self.patch_maps.mean(1).tolist(),
            "registers": self.registers.mean(1).tolist(),
            "self": self.self_weight.mean(1).tolist(),
        }


def cls_attention(model: HookedModel, images: torch.Tensor, blocks: Sequence[int] | None = None) -> ClsAttention:
    """Class-token attention rows [L, B, H, T] of the selected blocks (GLA rows without building A)."""
    blocks, kinds = _select_blocks(model, blocks)
    cache = _run(model, images, blocks, kinds)
    layout = model.token_layout
    cls = layout["cls"].start
    rows = []
    for i in blocks:
        if kinds[i] == "gla":
            rows.append(implicit_attention_row(*_gla_inputs(cache, i), t=cls, scale=model.blocks[i].attn.scale))
        else:
            rows.append(cache[f"blocks.{i}.attn.hook_pattern"][..., cls, :].float())
    return ClsAttention(
        rows=torch.stack(rows), blocks=blocks, kinds=[kinds[i] for i in blocks], layout=layout, grid_size=_grid(model)
    )


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


@contextmanager
def _swapped(owner: Any, name: str, value: Any) -> Iterator[None]:
    """Temporarily replace attribute `name` of `owner`."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextmanager
def explicit_attention() -> Iterator[list[torch.Tensor]]:
    """Within the block, GLA and SDPA attention run as A @ v; yields the list the matrices A [B,H,T,T] go to, in order.

    Patches `lkat_lens.models.attention.gated_linear_attention` and `torch.nn.functional.scaled_dot_product_attention`
    (process-wide) while active.
    """
    recorded: list[torch.Tensor] = []

    def gla(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        gk: torch.Tensor,
        scale: float | None = None,
        mode: str = "auto",
    ) -> torch.Tensor:
        a = implicit_attention(q, k, gk, scale=scale)
        recorded.append(a)
        return (a @ v.transpose(1, 2).to(a.dtype)).transpose(1, 2).to(q.dtype)

    def sdpa(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if attn_mask is not None or is_causal or dropout_p or enable_gqa:
            raise ValueError("explicit attention supports plain bidirectional attention in eval mode only")
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        a = torch.softmax((q @ k.transpose(-1, -2)).float() * scale, dim=-1)
        recorded.append(a)
        return a.to(v.dtype) @ v

    with _swapped(attention_layers, "gated_linear_attention", gla), _swapped(F, "scaled_dot_product_attention", sdpa):
        yield recorded


@dataclass
class AttentionGradients:
    """Every block's attention matrix and the gradient of the target logit with respect to it."""

    attention: torch.Tensor  # [L, B, H, T, T] fp32 (fp64 for an fp64 model)
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


def _targets(logits: torch.Tensor, target: int | torch.Tensor | None) -> torch.Tensor:
    """Class index per image: the prediction by default, or the given class(es)."""
    if target is None:
        return logits.argmax(-1)
    return torch.as_tensor(target, device=logits.device).long().expand(logits.shape[0])


def attention_gradients(
    model: HookedModel, images: torch.Tensor, target: int | torch.Tensor | None = None
) -> AttentionGradients:
    """Attention matrices of all blocks and ∂ logit_target / ∂A, from one forward and backward with A explicit."""
    depth = len(attention_kinds(model))
    with torch.enable_grad(), explicit_attention() as recorded:
        logits = model(images.detach().requires_grad_(True))
    if len(recorded) != depth:
        raise RuntimeError(
            f"materialised {len(recorded)} attention matrices for {depth} blocks; the model's attention must go "
            "through gated_linear_attention or F.scaled_dot_product_attention (timm: keep fused attention on)"
        )
    chosen = _targets(logits, target)
    grads = torch.autograd.grad(logits.gather(1, chosen[:, None]).sum(), recorded)
    return AttentionGradients(
        attention=torch.stack([a.detach() for a in recorded]),
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
    if method == "attention":
        joint, chosen = rollout(attention_matrices(model, images).matrices), None
    else:
        grads = attention_gradients(model, images, target)
        joint, chosen = rollout(grads.attention, grads.gradients), grads.target
    return Rollout(joint=joint, method=method, target=chosen, layout=model.token_layout, grid_size=_grid(model))
