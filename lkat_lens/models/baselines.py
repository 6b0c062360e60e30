"""Hook points for timm's own baselines (VisionTransformer `vit_*`, MlpMixer `mixer_*`), attached in place.

`attach_hook_points(model)` adds identity HookPoints as children of the timm modules and routes their tensors
through them with forward hooks, so the state_dict, the timm API and the outputs stay as they were, and the
model gains the HookedModel interface (list_hooks, hooks(...), run_with_cache(...)) and a `token_layout`:

    hook_embed                      [B,T,D]   tokens entering the first block (after norm_pre / stem)
    blocks.{i}.hook_resid_pre/post  [B,T,D]
    blocks.{i}.attn.hook_pattern    [B,H,T,T] softmax probabilities, fp32 (ViT; computed only when hooked)
    blocks.{i}.attn.hook_out        [B,T,D]   attention output after proj, before LayerScale (ViT)
    hook_final                      [B,T,D]   tokens after the final `model.norm`

Once hook_pattern is hooked, the attention output is recomputed from the hooked pattern (o = pattern @ v), so
the pattern is in the autograd graph and a hook that replaces or edits it changes the output.
The hooked class is made at attach time: save the state_dict (as checkpoints do), not the pickled module.
"""

from __future__ import annotations

from functools import cache, partial
from typing import Any

import torch
from timm.models.mlp_mixer import MlpMixer
from timm.models.vision_transformer import Attention, VisionTransformer
from torch import nn

from .hooks import HookedModel, HookPoint, is_hooked


class HookedTimm(HookedModel):
    """Mixin given to a timm model by attach_hook_points; subclasses add `token_layout`."""


class _HookedViT(HookedTimm):
    @property
    def token_layout(self) -> dict[str, slice]:
        """timm ViT: class token first, then registers, then patches."""
        cls = 0 if self.cls_token is None else 1
        prefix = cls + self.num_reg_tokens
        layout = {"cls": slice(0, 1)} if cls else {}
        if self.num_reg_tokens:
            layout["registers"] = slice(cls, prefix)
        layout["patches"] = slice(prefix, prefix + self.patch_embed.num_patches)
        return layout


class _HookedMixer(HookedTimm):
    @property
    def token_layout(self) -> dict[str, slice]:
        """MLP-Mixer: patches only."""
        return {"patches": slice(0, self.stem.num_patches)}


@cache
def _hooked_class(base: type[nn.Module], mixin: type[HookedTimm]) -> type:
    return type(f"Hooked{base.__name__}", (base, mixin), {"__module__": __name__})


def attach_hook_points(model: nn.Module) -> HookedTimm:
    """Give a timm VisionTransformer or MlpMixer hook points, in place; returns the same object."""
    if isinstance(model, HookedTimm):
        return model
    if isinstance(model, VisionTransformer):
        mixin, embed_source = _HookedViT, model.norm_pre
    elif isinstance(model, MlpMixer):
        mixin, embed_source = _HookedMixer, model.stem
    else:
        raise TypeError(
            f"hook points are available for timm VisionTransformer and MlpMixer, not {type(model).__name__}"
        )
    model.hook_embed = _routed_output(embed_source)
    for block in model.blocks:
        block.hook_resid_pre = HookPoint()
        block.register_forward_pre_hook(partial(_route_input, block.hook_resid_pre))
        block.hook_resid_post = _routed_output(block)
        attn = getattr(block, "attn", None)
        if isinstance(attn, Attention):
            attn.hook_pattern, attn.hook_out = HookPoint(), HookPoint()
            attn.register_forward_hook(_attention_hook, with_kwargs=True)
    model.hook_final = _routed_output(model.norm)
    model.__class__ = _hooked_class(type(model), mixin)
    model.setup_hooks()
    return model


def _routed_output(module: nn.Module) -> HookPoint:
    """A new HookPoint that `module`'s output passes through (a partial: deepcopy re-targets the copy)."""
    point = HookPoint()
    module.register_forward_hook(partial(_route_output, point))
    return point


def _route_output(point: HookPoint, module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
    return point(output)


def _route_input(point: HookPoint, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (point(args[0]), *args[1:])


def attention_pattern(attn: Attention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax probabilities [B,H,T,T] (fp32) and values [B,H,T,dh] of a timm Attention on input x [B,T,D]."""
    b, t, _ = x.shape
    qkv = attn.qkv(x).reshape(b, t, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    return torch.softmax((q @ k.transpose(-1, -2)).float() * attn.scale, dim=-1), v


def attend(attn: Attention, x: torch.Tensor, pattern: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The output of a timm Attention computed from a given pattern and values (its forward after softmax)."""
    o = (attn.attn_drop(pattern.to(v.dtype)) @ v).transpose(1, 2).flatten(2)
    norm, gate = getattr(attn, "norm", None), getattr(attn, "gate", None)  # absent in older timm
    if norm is not None:
        o = norm(o)
    if gate is not None:
        o = o * gate(x).sigmoid()
    return attn.proj_drop(attn.proj(o))


def _attention_hook(
    attn: Attention, args: tuple[Any, ...], kwargs: dict[str, Any], output: torch.Tensor
) -> torch.Tensor:
    if is_hooked(attn.hook_pattern):
        if kwargs.get("attn_mask") is not None or kwargs.get("is_causal", False):
            raise ValueError("hook_pattern does not support attention masks")
        x = args[0] if args else kwargs["x"]
        probs, v = attention_pattern(attn, x)
        output = attend(attn, x, attn.hook_pattern(probs), v)
    return attn.hook_out(output)
