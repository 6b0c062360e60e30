"""2D rotary position embedding ("2dv1") for patch tokens, as in the reference code."""

from __future__ import annotations

import torch
from torch import nn


def rope_2d_angles(grid: tuple[int, int], head_dim: int, theta: float = 10000.0, base_size: int = 14) -> torch.Tensor:
    """Rotation angles [H*W, head_dim/2] for a patch grid, interleaving x and y frequencies."""
    if head_dim % 4:
        raise ValueError(f"2D RoPE needs a head dim divisible by 4, got {head_dim}")
    h, w = grid
    flat = torch.arange(h * w, dtype=torch.float64)
    x_pos = (flat % w) * (base_size / w)
    y_pos = torch.div(flat, w, rounding_mode="floor") * (base_size / h)
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 4, dtype=torch.float64)[: head_dim // 4] / head_dim)
    x_ang = torch.outer(x_pos, freqs)
    y_ang = torch.outer(y_pos, freqs)
    return torch.stack([x_ang, y_ang], dim=-1).reshape(h * w, head_dim // 2).float()


class Rope2D(nn.Module):
    """Rotates consecutive channel pairs of the first H*W tokens of q/k [B, T, heads, head_dim]."""

    def __init__(self, grid: tuple[int, int], head_dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        self.grid = grid
        self.num_patches = grid[0] * grid[1]
        angles = rope_2d_angles(grid, head_dim, theta)
        self.register_buffer("cos", angles.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", angles.sin()[None, :, None, :], persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.num_patches
        if x.shape[1] < n:
            raise ValueError(f"sequence of {x.shape[1]} tokens is shorter than the {n} patches")
        patches = x[:, :n].float().unflatten(-1, (-1, 2))
        even, odd = patches.unbind(-1)
        rotated = torch.stack([even * self.cos - odd * self.sin, even * self.sin + odd * self.cos], dim=-1)
        return torch.cat([rotated.flatten(-2).to(x.dtype), x[:, n:]], dim=1)
