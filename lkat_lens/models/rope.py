"""2D rotary position embeddings for patch tokens, in the reference code's two layouts ("2dv1" and "2dv0")."""

from __future__ import annotations

import torch
from torch import nn

from lkat_lens.kernels.gla_input import turn

ROPE_MODES = ("2dv1", "2dv0")


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


def rope_2dv0_tables(grid: tuple[int, int], head_dim: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """ "2dv0" per-channel (cos, sin) tables [H*W, head_dim]: first half row angles, second half column angles,
    each half its frequencies repeated twice (so the two channels of a rotated pair may differ in frequency)."""
    if head_dim % 4:
        raise ValueError(f"2D RoPE needs a head dim divisible by 4, got {head_dim}")
    h, w = grid
    half = head_dim // 2
    freqs = 1.0 / theta ** (torch.arange(0, half, 2, dtype=torch.float32) / half)
    rows = (torch.arange(h, dtype=torch.float32) / h * half)[:, None] @ freqs[None, :]
    cols = (torch.arange(w, dtype=torch.float32) / w * half)[:, None] @ freqs[None, :]
    rows, cols = rows.repeat(1, 2), cols.repeat(1, 2)
    angles = torch.cat([rows[:, None, :].expand(h, w, half), cols[None, :, :].expand(h, w, half)], dim=-1)
    angles = angles.reshape(h * w, head_dim)
    return angles.cos(), angles.sin()


class Rope2D(nn.Module):
    """ "2dv1": rotates consecutive channel pairs of the first H*W tokens of q/k [B, T, heads, head_dim]."""

    def __init__(self, grid: tuple[int, int], head_dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        self.grid = grid
        self.num_patches = grid[0] * grid[1]
        angles = rope_2d_angles(grid, head_dim, theta)
        self.register_buffer("cos", angles.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", angles.sin()[None, :, None, :], persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = _check_length(x.shape[1], self.num_patches)
        patches = x[:, :n].float().unflatten(-1, (-1, 2))
        even, odd = patches.unbind(-1)
        rotated = torch.stack([even * self.cos - odd * self.sin, even * self.sin + odd * self.cos], dim=-1)
        return torch.cat([rotated.flatten(-2).to(x.dtype), x[:, n:]], dim=1)

    def channel_tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rotation as x * cos + turn(x) * sin (see `channel_tables`): each pair's angle on both its channels."""
        return _reused_tables(
            self,
            (self.cos, self.sin),
            length,
            lambda: channel_tables(
                self.cos[0, :, 0].repeat_interleave(2, -1), self.sin[0, :, 0].repeat_interleave(2, -1), length
            ),
        )


class Rope2DV0(nn.Module):
    """ "2dv0": x * cos + pair_rotate(x) * sin with per-channel tables over the first H*W tokens of q/k
    [B, T, heads, head_dim]. The tables are persistent buffers `freqs_cos` / `freqs_sin` [H*W, head_dim], as in
    the reference's state_dicts, so a loaded checkpoint uses its own stored tables."""

    def __init__(self, grid: tuple[int, int], head_dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        self.grid = grid
        self.num_patches = grid[0] * grid[1]
        cos, sin = rope_2dv0_tables(grid, head_dim, theta)
        self.register_buffer("freqs_cos", cos)
        self.register_buffer("freqs_sin", sin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = _check_length(x.shape[1], self.num_patches)
        patches = x[:, :n].float()
        rotated = patches * self.freqs_cos[:, None, :] + turn(patches) * self.freqs_sin[:, None, :]
        return torch.cat([rotated.to(x.dtype), x[:, n:]], dim=1)

    def channel_tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rotation as x * cos + turn(x) * sin (see `channel_tables`): the stored tables."""
        tables = (self.freqs_cos, self.freqs_sin)
        return _reused_tables(self, tables, length, lambda: channel_tables(*tables, length))


def channel_tables(cos: torch.Tensor, sin: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables [length, head_dim] (fp32, or fp64 from fp64 ones) of a rotation x -> x * cos + turn(x) * sin (turn:
    (x_0, x_1, ...) -> (-x_1, x_0, ...)) from the patches' tables [H*W, head_dim]; the rows past the patches leave
    tokens unchanged (cos 1, sin 0). Both layouts' forward is this rotation; the fused GLA input kernel takes these."""
    n = _check_length(length, cos.shape[0])
    dtype = torch.promote_types(cos.dtype, torch.float32)
    rest = cos.new_zeros(length - n, cos.shape[1], dtype=dtype)
    return torch.cat([cos.to(dtype), rest + 1.0]), torch.cat([sin.to(dtype), rest])


def _reused_tables(
    module: nn.Module, buffers: tuple[torch.Tensor, ...], length: int, build
) -> tuple[torch.Tensor, ...]:
    """The channel tables build() makes, kept on the module and returned again while `length` and its buffers are
    unchanged (the same storage, no in-place write since: a loaded state_dict or .to() rebuilds them). Every LKAT block
    asks for them on every forward; building them is eight small torch ops of eager host time per block. Tables built
    under torch.inference_mode are built again outside it (autograd cannot save inference tensors); tables built
    outside serve both. While torch.compile traces they are built, as graph nodes."""
    if torch.compiler.is_compiling():
        return build()
    key = (length, *((t.data_ptr(), t._version) for t in buffers))
    kept = getattr(module, "_kept_tables", None)
    if kept is None or kept[0] != key or (kept[1][0].is_inference() and not torch.is_inference_mode_enabled()):
        kept = (key, build())
        module._kept_tables = kept
    return kept[1]


def make_rope(mode: str, grid: tuple[int, int], head_dim: int, theta: float = 10000.0) -> nn.Module:
    """The RoPE module of a reference `rope_mode`."""
    if mode not in ROPE_MODES:
        raise ValueError(f"rope_mode must be one of {ROPE_MODES}, got {mode!r}")
    return (Rope2D if mode == "2dv1" else Rope2DV0)(grid, head_dim, theta)


def _check_length(length: int, n: int) -> int:
    """n, the patch count, unless a sequence of `length` tokens is shorter."""
    if length < n:
        raise ValueError(f"sequence of {length} tokens is shorter than the {n} patches")
    return n
