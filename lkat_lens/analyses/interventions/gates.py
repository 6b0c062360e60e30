"""GLA interventions: clamp forget gates (α = 1 never forgets, α = 0 forgets at once) and cut the recurrent state.

A GLA block mixes tokens by S_t = diag(α_t) S_{t-1} + k_t v_tᵀ, o_t = scale q_tᵀ S_t, with α_t = exp(gk_t) read
at `blocks.i.attn.hook_gk` [B, T, H, K]. Tokens run in the order of `model.token_layout`: patches (row-major over
the patch grid), then registers, then the class token, so the class token reads the whole sequence.

- `GateClamp` sets log α of one head (or one key channel of it, or every head) to log α for every token: 0 for
  α = 1, CLOSED_LOG_GATE for α = 0. Either way the block then mixes through its exact implicit attention
  (`hook_pattern` is hooked; kernels/gla.py computes it from fp64 prefix sums), so no chunked form (torch's or
  fla's) takes exp of differences of its fp32 cumulative sums of the clamped gates (log α = -inf gives nan there).
- `StateCut` at position p: targets t >= p read nothing of sources s < p (the entries A[t, s] of the implicit
  attention are zeroed, which is S_{p-1} := 0 in the recurrence). With `through_convs` (default) the short causal
  convolutions on q, k and v are cut too (their outputs at t >= p are recomputed from inputs zeroed before p), so
  nothing before p reaches the block's outputs at p and after; without it only the recurrent state is cut and the
  convolutions still carry the conv_size - 1 tokens before p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from lkat_lens.models.attention import ShortConvolution, VisionGLA

from ..parts import gla_blocks
from ..serialize import json_ready
from .effects import measure

__all__ = [
    "CLOSED_LOG_GATE",
    "GateClamp",
    "GateClampSweep",
    "StateCut",
    "StateCutSweep",
    "gate_clamp_sweep",
    "gla_layer",
    "state_cut_sweep",
    "token_names",
]

TOKEN_KINDS = {"patches": "patch", "registers": "register"}  # token_layout key -> one token's name
CLOSED_LOG_GATE = -1000.0  # log α for α = 0: exp is exactly 0 in fp32 and fp64; its prefix sums are exact integers


def gla_layer(model: nn.Module, block: int) -> VisionGLA:
    """Block `block`'s GLA layer; ValueError for a block without one."""
    blocks = gla_blocks(model)
    if block not in blocks:
        raise ValueError(f"block {block} has no GLA forget gate; GLA blocks: {blocks}")
    return model.blocks[block].attn


def _check_index(what: str, index: int | None, size: int) -> None:
    """ValueError for an index outside [0, size)."""
    if index is not None and not 0 <= index < size:
        raise ValueError(f"{what} {index} is out of range [0, {size})")


def _span(index: int | None, width: int = 1) -> slice:
    """The slice of one index (of `width` consecutive entries each), or everything for None."""
    return slice(None) if index is None else slice(index * width, (index + 1) * width)


def _exact_mixing(attn: VisionGLA) -> RemovableHandle:
    """Make the block mix through its exact implicit attention (a hook on hook_pattern that changes nothing)."""
    return attn.hook_pattern.register_forward_hook(lambda module, args, output: None)


@dataclass(frozen=True)
class GateClamp:
    """Clamp the forget gate α of a block's head (every head for None; one key channel, or all for None) to
    `alpha` in [0, 1] for every token."""

    block: int
    head: int | None = None
    channel: int | None = None
    alpha: float = 1.0

    @property
    def log_alpha(self) -> float:
        """The clamped log gate: ln α, CLOSED_LOG_GATE for α = 0."""
        return CLOSED_LOG_GATE if self.alpha == 0 else math.log(self.alpha)

    def describe(self) -> str:
        where = f"block {self.block}" + ("" if self.head is None else f" head {self.head}")
        return where + ("" if self.channel is None else f" channel {self.channel}") + f" α={self.alpha:g}"

    def attach(self, model: nn.Module, rows: slice) -> list[RemovableHandle]:
        attn = gla_layer(model, self.block)
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"a forget gate α lies in [0, 1], got {self.alpha}")
        _check_index("head", self.head, attn.num_heads)
        _check_index("key channel", self.channel, attn.head_dim)
        heads, channels, value = _span(self.head), _span(self.channel), self.log_alpha

        def clamp(module: nn.Module, args: tuple, gk: torch.Tensor) -> torch.Tensor:
            gk = gk.clone()
            gk[rows, :, heads, channels] = value
            return gk

        return [attn.hook_gk.register_forward_hook(clamp), _exact_mixing(attn)]


@dataclass(frozen=True)
class StateCut:
    """Cut a block's recurrent state before token `position` (of one head, or every head for None): tokens at
    `position` and after read nothing of the tokens before it; `through_convs` cuts the short convolutions too."""

    block: int
    position: int
    head: int | None = None
    through_convs: bool = True

    def describe(self) -> str:
        where = f"block {self.block}" + ("" if self.head is None else f" head {self.head}")
        return f"{where} cut before token {self.position}" + ("" if self.through_convs else " (state only)")

    def attach(self, model: nn.Module, rows: slice) -> list[RemovableHandle]:
        attn = gla_layer(model, self.block)
        _check_index("head", self.head, attn.num_heads)
        _check_index("position", self.position, len(token_names(model.token_layout)))
        heads, p = _span(self.head), self.position

        def cut(module: nn.Module, args: tuple, pattern: torch.Tensor) -> torch.Tensor:
            pattern = pattern.clone()
            pattern[rows, heads, p:, :p] = 0
            return pattern

        handles = [attn.hook_pattern.register_forward_hook(cut)]
        if self.through_convs:
            widths = (attn.head_dim, attn.head_dim, attn.head_v_dim)
            for conv, width in zip((attn.q_conv1d, attn.k_conv1d, attn.v_conv1d), widths, strict=True):
                if isinstance(conv, ShortConvolution):
                    handles.append(conv.register_forward_hook(self._conv_cut(rows, _span(self.head, width))))
        return handles

    def _conv_cut(self, rows: slice, channels: slice):
        """A forward hook on a ShortConvolution: outputs at and after the cut recomputed without earlier inputs."""
        p = self.position

        def hook(module: ShortConvolution, args: tuple, out: torch.Tensor) -> torch.Tensor:
            x = args[0][rows].clone()
            x[:, :p, channels] = 0
            out = out.clone()
            out[rows, p:, channels] = module.forward(x)[:, p:, channels]
            return out

        return hook


def token_names(layout: dict[str, slice]) -> list[str]:
    """A name per token position in model.token_layout order: "patch 0", ..., "register 0", ..., "cls"."""
    names = [""] * max(span.stop for span in layout.values())
    for kind, span in layout.items():
        for i in range(span.start, span.stop):
            names[i] = f"{TOKEN_KINDS[kind]} {i - span.start}" if kind in TOKEN_KINDS else kind
    return names


@dataclass
class GateClampSweep:
    """Every head of every GLA block clamped alone, and every block's heads clamped together, to each α."""

    blocks: list[int]
    alphas: list[float]
    head_logit_change: torch.Tensor  # [alphas, blocks, heads] mean change of the label-class logit
    head_accuracy_change: torch.Tensor  # [alphas, blocks, heads] percentage points
    block_logit_change: torch.Tensor  # [alphas, blocks] all heads of the block clamped
    block_accuracy_change: torch.Tensor  # [alphas, blocks]
    clean_accuracy: float
    clean_logit: float
    num_images: int

    def to_dict(self) -> dict[str, Any]:
        return json_ready(self)


def gate_clamp_sweep(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    alphas: tuple[float, ...] = (1.0, 0.0),
    blocks: list[int] | None = None,
    batch_size: int | None = None,
) -> GateClampSweep:
    """Clamp each head of each GLA block (and each block's heads together) to each α; measure on the images."""
    blocks = gla_blocks(model) if blocks is None else list(blocks)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no GLA blocks to clamp")
    heads = gla_layer(model, blocks[0]).num_heads
    clamps = [GateClamp(b, h, None, a) for a in alphas for b in blocks for h in [*range(heads), None]]
    found = measure(model, images, labels, clamps, batch_size)
    shape = (len(alphas), len(blocks), heads + 1)
    logit, accuracy = found.logit_change.view(shape), found.accuracy_change.view(shape)
    return GateClampSweep(
        blocks=blocks,
        alphas=[float(a) for a in alphas],
        head_logit_change=logit[..., :heads],
        head_accuracy_change=accuracy[..., :heads],
        block_logit_change=logit[..., heads],
        block_accuracy_change=accuracy[..., heads],
        clean_accuracy=found.clean_accuracy,
        clean_logit=found.clean_logit,
        num_images=found.num_images,
    )


@dataclass
class StateCutSweep:
    """The state of every GLA block (all heads) cut before each chosen position."""

    blocks: list[int]
    positions: list[int]
    position_names: list[str]
    logit_change: torch.Tensor  # [blocks, positions]
    accuracy_change: torch.Tensor  # [blocks, positions]
    through_convs: bool
    clean_accuracy: float
    clean_logit: float
    num_images: int

    def to_dict(self) -> dict[str, Any]:
        return json_ready(self)


def state_cut_sweep(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    positions: list[int] | None = None,
    blocks: list[int] | None = None,
    through_convs: bool = True,
    batch_size: int | None = None,
) -> StateCutSweep:
    """Cut each GLA block's state before each position (default: every token but the first) and measure."""
    blocks = gla_blocks(model) if blocks is None else list(blocks)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no GLA blocks to cut")
    names = token_names(model.token_layout)
    positions = list(range(1, len(names))) if positions is None else list(positions)
    for p in positions:
        _check_index("position", p, len(names))
    cuts = [StateCut(b, p, None, through_convs) for b in blocks for p in positions]
    found = measure(model, images, labels, cuts, batch_size)
    shape = (len(blocks), len(positions))
    return StateCutSweep(
        blocks=blocks,
        positions=positions,
        position_names=[names[p] for p in positions],
        logit_change=found.logit_change.view(shape),
        accuracy_change=found.accuracy_change.view(shape),
        through_convs=through_convs,
        clean_accuracy=found.clean_accuracy,
        clean_logit=found.clean_logit,
        num_images=found.num_images,
    )
