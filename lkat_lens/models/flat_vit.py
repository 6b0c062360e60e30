"""What LKAT, rbfKAT and ViT-5 share: a flat ViT (patch embedding, blocks, final norm, linear head) in timm's
conventions.

The reference initialisation (learned tokens and Linears trunc-normal(0.02), biases zero), the classifier API
(`get_classifier`, `reset_classifier`), `no_weight_decay`, and timm's feature extraction: `feature_info` and
`prune_intermediate_layers` here, `forward_intermediates` from HookedModel, so that
timm.create_model(name, features_only=True) gives timm's FeatureGetterNet.
"""

from __future__ import annotations

import torch
from timm.layers import trunc_normal_
from timm.models._features import feature_take_indices
from torch import nn

from .hooks import HookedModel, HookPoint
from .patch_embed import PatchEmbed


class FlatViT(HookedModel):
    """Base of the flat ViTs. A subclass names its learned token parameters in TOKENS (in initialisation order),
    builds its layers between `_embed_patches` and `_finish`, and defines `embed` (images -> the tokens that
    enter the first block) and `forward_head`."""

    TOKENS: tuple[str, ...] = ()

    def _embed_patches(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int, num_classes: int) -> None:
        """The patch embedding and the sizes timm reads (num_classes, num_features, embed_dim, grid_size, ...)."""
        self.num_classes, self.num_features, self.embed_dim = num_classes, embed_dim, embed_dim
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.grid_size = tuple(self.patch_embed.grid_size)
        self.num_patches = self.patch_embed.num_patches

    def _finish(self, norm: nn.Module) -> None:
        """After the blocks: feature_info, the final norm, hook_final and the head; then the reference
        initialisation and the hook points' names."""
        reduction = self.patch_embed.patch_size[0]
        self.feature_info = [
            dict(module=f"blocks.{i}", num_chs=self.embed_dim, reduction=reduction) for i in range(len(self.blocks))
        ]
        self.norm = norm
        self.hook_final = HookPoint()
        self.head = nn.Linear(self.embed_dim, self.num_classes) if self.num_classes > 0 else nn.Identity()
        self._init_weights()
        self.setup_hooks()

    def _self_initialised(self) -> set[nn.Module]:
        """Linears that keep their own initialisation (none here)."""
        return set()

    def _init_weights(self) -> None:
        """Reference initialisation: the tokens and every Linear but the self-initialised trunc-normal(0.02),
        biases zero."""
        for name in self.TOKENS:
            if getattr(self, name) is not None:
                trunc_normal_(getattr(self, name), std=0.02)
        own_init = self._self_initialised()
        for m in self.modules():
            if isinstance(m, nn.Linear) and m not in own_init:
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Parameters exempt from weight decay: the learned tokens."""
        return {name for name in self.TOKENS if getattr(self, name) is not None}

    def get_classifier(self) -> nn.Module:
        """The classification head."""
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head with a fresh one for `num_classes` classes."""
        self.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        if num_classes > 0:
            trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """timm's: drop the blocks after the last of `indices` (the last n for an int), and the final norm and head
        when asked; returns the kept indices."""
        take, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0)
        return take

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images [B, C, H, W] -> the tokens entering the first block [B, T, D]."""
        raise NotImplementedError

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens -> logits."""
        raise NotImplementedError

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images [B, C, H, W] -> normalised tokens [B, T, D] (`token_layout` says which token is which)."""
        x = self.hook_embed(self.embed(x))
        for block in self.blocks:
            x = block(x)
        return self.hook_final(self.norm(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))
