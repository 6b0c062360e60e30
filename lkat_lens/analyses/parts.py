"""What a model is made of, asked in one place: blocks, KAN layers, attention kind, token layout, patch grid.

Every analysis, the `Study` and the front ends ask these questions here (see docs/architecture.md), so "has this
model GLA gates?" or "which KAN layers does block 3 have?" has one answer. Also the two helpers every analysis
needs: `eval_mode` (run in eval mode, restore the flag after) and `resolve_target` (the class per image).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from lkat_lens.models.kan import KANLayer

TargetLike = int | Sequence[int] | torch.Tensor | None


def kan_layers(model: nn.Module) -> dict[str, KANLayer]:
    """Every KANLayer of a model by module name (a bare layer is named "layer")."""
    return {name or "layer": m for name, m in model.named_modules() if isinstance(m, KANLayer)}


def block_kan_layers(model: nn.Module, block: int) -> dict[str, str]:
    """One block's KAN layers as short name ("fc1") -> module name ("blocks.3.mlp.fc1"); empty without KAN."""
    prefix = f"blocks.{block}."
    return {name.rsplit(".", 1)[-1]: name for name in kan_layers(model) if name.startswith(prefix)}


def attention_kinds(model: nn.Module) -> list[str]:
    """Per block, "gla" (a GLA layer: it has hook_gk) or "softmax"."""
    points = model.hook_points()
    kinds = []
    for i in range(len(model.blocks)):
        if f"blocks.{i}.attn.hook_pattern" not in points:
            raise ValueError(f"block {i} of {type(model).__name__} has no attention hook point (hook_pattern)")
        kinds.append("gla" if f"blocks.{i}.attn.hook_gk" in points else "softmax")
    return kinds


def gla_blocks(model: nn.Module) -> list[int]:
    """The blocks whose attention is GLA (they have forget gates); empty for softmax models."""
    points = model.hook_points()
    return [i for i in range(len(model.blocks)) if f"blocks.{i}.attn.hook_gk" in points]


def has_head_outputs(model: nn.Module) -> bool:
    """Whether every block exposes its per-head attention outputs (attn.hook_z: LKAT, rbfKAT, ViT-5)."""
    points = model.hook_points()
    return all(f"blocks.{i}.attn.hook_z" in points for i in range(len(model.blocks)))


def head_projection(model: nn.Module, block: int) -> nn.Linear:
    """The linear map from a block's per-head outputs (attn.hook_z, heads concatenated) to what its attention adds to
    the residual stream: GLA's o_proj, MHSA's proj, or for ViT-5 proj scaled by the block's LayerScale gamma_1 (a
    detached copy); ValueError for a model without per-head outputs."""
    attn = model.blocks[block].attn
    if f"blocks.{block}.attn.hook_z" not in model.hook_points():
        raise ValueError(
            f"{type(model).__name__} has no per-head outputs (attn.hook_z); per-head DLA needs LKAT, rbfKAT or ViT-5"
        )
    proj = attn.o_proj if hasattr(attn, "o_proj") else attn.proj
    scale = getattr(model.blocks[block], "gamma_1", None)
    if scale is None:
        return proj
    scaled = nn.Linear(proj.in_features, proj.out_features, bias=proj.bias is not None).to(proj.weight)
    with torch.no_grad():
        scaled.weight.copy_(scale[:, None] * proj.weight)
        if proj.bias is not None:
            scaled.bias.copy_(scale * proj.bias)
    return scaled


def residual_names(model: nn.Module) -> list[str]:
    """Hook names of the residual stream by depth: hook_embed, then each block's hook_resid_post."""
    return ["hook_embed", *(f"blocks.{i}.hook_resid_post" for i in range(len(model.blocks)))]


def class_token_index(model: nn.Module) -> int:
    """Position of the class token; ValueError for a model without one (reference cfg use_cls_token: false)."""
    if "cls" not in model.token_layout:
        raise ValueError(
            f"{type(model).__name__} has no class token (it classifies from the mean of its patch tokens); "
            "class-token attention and rollout need one"
        )
    return model.token_layout["cls"].start


def token_positions(model: nn.Module, tokens: int) -> dict[str, list[int]]:
    """The positions of each token type ("patches", "registers", "cls", as the model has them) in a sequence of
    `tokens` tokens."""
    return {kind: list(range(*where.indices(tokens))) for kind, where in model.token_layout.items()}


def patch_grid(model: nn.Module) -> tuple[int, int]:
    """The patch grid (rows, columns)."""
    return tuple(int(n) for n in model.patch_embed.grid_size)


def patch_size(model: nn.Module) -> tuple[int, int]:
    """The patch size (height, width) of a ViT-like model (patch_embed, or stem for MLP-Mixer)."""
    embed = getattr(model, "patch_embed", None) or getattr(model, "stem", None)
    size = getattr(embed, "patch_size", None)
    if size is None:
        raise ValueError(f"{type(model).__name__} has no patch_embed.patch_size; pass patch_size=(ph, pw)")
    return pair(size)


def pair(size: int | Sequence[int]) -> tuple[int, int]:
    """(h, w) from an int or a pair."""
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put the model in eval mode for a with-block and restore its training flag after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def resolve_target(model: nn.Module, images: torch.Tensor, target: TargetLike = None) -> torch.Tensor:
    """Class per image [B] (long): the predicted class when target is None, else the given class(es)."""
    if target is None:
        with torch.no_grad():
            return model(images).argmax(-1)
    return targets_for(images.shape[0], target, images.device)


def targets_for(batch: int, target: int | Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """A given class, or one per image, as a long tensor [batch]."""
    out = torch.as_tensor(target, dtype=torch.long, device=device).reshape(-1)
    if out.numel() == 1:
        return out.expand(batch).clone()
    if out.numel() != batch:
        raise ValueError(f"target has {out.numel()} entries for {batch} images")
    return out
