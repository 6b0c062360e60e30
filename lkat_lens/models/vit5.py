"""ViT-5 (Wang et al. 2026) as the reference code builds it: a flat ViT with RMSNorm, QK-norm, 2D RoPE,
registers and LayerScale. Tokens: [class token, patches (N), registers (R)].

Parameter and buffer names follow the reference implementation (`reg_token`, `gamma_1`, `attn.rope.freqs`,
...), so its state_dicts load without renaming.

Hook points: hook_embed, blocks.{i}.hook_resid_pre/mid/post [B,T,D], blocks.{i}.attn.hook_q/k (after QK norm
and RoPE) / hook_v [B,T,H,dh], blocks.{i}.attn.hook_pattern [B,H,T,T] (fp32 softmax, computed only when
hooked, then used as o = pattern @ v: hooks read, replace or edit it), blocks.{i}.attn.hook_out
[B,T,D] (after proj, before LayerScale), hook_final (after the final norm).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from timm.layers import DropPath, Mlp, RmsNorm, apply_rot_embed
from torch import nn

from .attention import SoftmaxAttention
from .flat_vit import FlatViT
from .hooks import HookPoint
from .registry import register_variants

# timm registry names (registered at import) -> architecture defaults; paper Table "results-cls" ViT-5-*.
VIT5_VARIANTS: dict[str, dict[str, Any]] = {
    "vit5_micro": dict(img_size=16, patch_size=4, embed_dim=64, depth=4, num_heads=2, num_classes=10),
    "vit5_tiny_patch16_224": dict(embed_dim=192, depth=12, num_heads=3),
    "vit5_small_patch16_224": dict(embed_dim=384, depth=12, num_heads=6),
    "vit5_base_patch16_224": dict(embed_dim=768, depth=12, num_heads=12),
    "vit5_large_patch16_224": dict(embed_dim=1024, depth=24, num_heads=16),
}


def _check_pool(global_pool: str) -> None:
    if global_pool != "token":
        raise ValueError("ViT-5 classifies from its class token; global_pool must be 'token'")


def _square_side(count: int, what: str) -> int:
    side = math.isqrt(count)
    if side * side != count:
        raise ValueError(f"ViT-5 needs a square number of {what}, got {count}")
    return side


class AxialRope2D(nn.Module):
    """2D RoPE on a square token grid [B, side*side, H, dh]: a head's first half turns by row, second by col.

    Consecutive channel pairs rotate together; pair j of each half turns by position * freqs[j].
    """

    def __init__(self, head_dim: int, side: int, theta: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 4:
            raise ValueError(f"2D RoPE needs a head dim divisible by 4, got {head_dim}")
        self.side = side
        half = head_dim // 2
        self.register_buffer("freqs", 1.0 / theta ** (torch.arange(0, half, 2).float() / half))

    def angles(self) -> torch.Tensor:
        """Rotation angle per token and channel [side*side, head_dim] (each pair's angle twice)."""
        pos = torch.arange(self.side, device=self.freqs.device, dtype=torch.float32)
        axis = (pos[:, None] * self.freqs.float()).repeat_interleave(2, dim=-1)  # fp32 under autocast too
        n = self.side
        rows, cols = axis[:, None].expand(n, n, -1), axis[None, :].expand(n, n, -1)
        return torch.cat([rows, cols], dim=-1).flatten(0, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        angles = self.angles()[:, None, :]
        return apply_rot_embed(x.float(), angles.sin(), angles.cos()).to(x.dtype)


class ViT5Attention(SoftmaxAttention):
    """Softmax attention with QK RMSNorm and 2D RoPE: patches (theta 1e4), register grid (theta 100)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        grid_side: int,
        num_registers: int,
        *,
        qkv_bias: bool = False,
        rope_theta: float = 10000.0,
        reg_theta: float = 100.0,
        attn_drop: float = 0.0,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop)
        self.rope = AxialRope2D(self.head_dim, grid_side, rope_theta)
        reg_side = _square_side(num_registers, "registers")
        self.rope_reg = AxialRope2D(self.head_dim, reg_side, reg_theta) if num_registers else None

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """RoPE on q or k [B, 1+N+R, H, dh]: patches on their grid, registers on theirs, class token as is."""
        n = self.rope.side**2
        parts = [x[:, :1], self.rope(x[:, 1 : 1 + n])]
        if self.rope_reg is not None:
            parts.append(self.rope_reg(x[:, 1 + n :]))
        return torch.cat(parts, dim=1)


class ViT5Block(nn.Module):
    """Pre-norm block with LayerScale: x + γ1·attn(norm1(x)), then x + γ2·mlp(norm2(x)) (GELU MLP)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        grid_side: int,
        num_registers: int,
        *,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
        reg_theta: float = 100.0,
        init_scale: float = 1e-4,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
    ) -> None:
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.norm1 = RmsNorm(dim, eps=1e-6)
        self.attn = ViT5Attention(
            dim,
            num_heads,
            grid_side,
            num_registers,
            qkv_bias=qkv_bias,
            reg_theta=reg_theta,
            attn_drop=attn_drop,
        )
        self.gamma_1 = nn.Parameter(torch.full((dim,), init_scale))
        self.hook_resid_mid = HookPoint()
        self.norm2 = RmsNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU)
        self.gamma_2 = nn.Parameter(torch.full((dim,), init_scale))
        self.hook_resid_post = HookPoint()
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(x + self.drop_path(self.gamma_1 * self.attn(self.norm1(x))))
        return self.hook_resid_post(x + self.drop_path(self.gamma_2 * self.mlp(self.norm2(x))))


class ViT5(FlatViT):
    """ViT-5. Tokens: [class token, patches (N), registers (R)]; learned pos embedding on patches only."""

    TOKENS = ("cls_token", "pos_embed", "reg_token")

    def __init__(
        self,
        img_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
        num_registers: int = 4,
        reg_theta: float = 100.0,
        init_scale: float = 1e-4,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        global_pool: str = "token",
    ) -> None:
        super().__init__()
        _check_pool(global_pool)
        self.num_registers = num_registers
        self._embed_patches(img_size, patch_size, in_chans, embed_dim, num_classes)
        side = _square_side(self.num_patches, "patches")
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.reg_token = nn.Parameter(torch.zeros(1, num_registers, embed_dim)) if num_registers else None
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_patches, embed_dim))
        self.hook_embed = HookPoint()
        self.blocks = nn.ModuleList(
            ViT5Block(
                embed_dim,
                num_heads,
                side,
                num_registers,
                mlp_ratio=mlp_ratio,
                qkv_bias=qkv_bias,
                reg_theta=reg_theta,
                init_scale=init_scale,
                attn_drop=attn_drop_rate,
                drop_path=drop_path_rate,
            )
            for _ in range(depth)
        )
        self.head_drop = nn.Dropout(drop_rate)
        self._finish(RmsNorm(embed_dim, eps=1e-6))

    @property
    def token_layout(self) -> dict[str, slice]:
        """Where each token type sits in the sequence (registers omitted when there are none)."""
        n, r = self.num_patches, self.num_registers
        layout = {"cls": slice(0, 1), "patches": slice(1, 1 + n)}
        if r:
            layout["registers"] = slice(1 + n, 1 + n + r)
        return layout

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head with a fresh one for `num_classes` classes."""
        if global_pool is not None:
            _check_pool(global_pool)
        super().reset_classifier(num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images [B, C, H, W] -> tokens [B, 1+N+R, D]: class token, position-embedded patches, registers."""
        x = self.patch_embed(x) + self.pos_embed
        b = x.shape[0]
        tokens = [self.cls_token.expand(b, -1, -1), x]
        if self.reg_token is not None:
            tokens.append(self.reg_token.expand(b, -1, -1))
        return torch.cat(tokens, dim=1)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens -> logits, read from the class token (the first one)."""
        x = self.head_drop(x[:, 0])
        return x if pre_logits else self.head(x)


register_variants({name: (ViT5, defaults) for name, defaults in VIT5_VARIANTS.items()})
