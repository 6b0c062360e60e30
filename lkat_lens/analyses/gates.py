"""Forget gates of GLA blocks: alpha = exp(gk), its distribution and memory half-life, by token type and patch.

A key channel with gate alpha keeps alpha^n of what it stored n tokens ago, so its memory half-life is
ln 0.5 / ln alpha tokens (infinite when alpha = 1). Averages are taken on the log gate: the half-life of a
group of tokens is ln 0.5 / mean(ln alpha), the half-life of the geometric-mean gate, which is exactly how
fast a run of those tokens decays the state. (Averaging half-lives themselves would let any gate near 1
dominate.) Quantiles are nearest-rank, so the half-life quantiles are the half-lives of the gate quantiles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lkat_lens.models.hooks import HookedModel

from . import distributed_stats
from .batching import Images, batches, on_model
from .parts import gla_blocks
from .serialize import json_ready
from .tokens import layout_dict, token_groups

LN_HALF = math.log(0.5)
QUANTILES = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)


def half_life(log_alpha: torch.Tensor) -> torch.Tensor:
    """Memory half-life in tokens, ln 0.5 / ln alpha (fp64), from log gates; inf where alpha = 1."""
    g = log_alpha.double()
    return torch.where(g < 0, g.new_tensor(LN_HALF) / g, math.inf)  # tensor / tensor: correctly rounded


def nearest_rank_quantiles(x: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Quantiles of x along its last dim at `levels` (torch.quantile's "nearest"), as a trailing dim [..., Q]."""
    ranks = (levels.to(torch.float64) * (x.shape[-1] - 1)).round().long().to(x.device)
    return x.sort(-1).values[..., ranks]


@dataclass
class GateStats:
    """Forget-gate statistics of the GLA blocks; every mean and quantile is over images and tokens."""

    blocks: list[int]
    layout: dict[str, slice]
    grid_size: tuple[int, int]
    log_alpha: torch.Tensor  # [L, H, dk] mean log gate per key channel (fp64)
    quantile_levels: torch.Tensor  # [Q]
    log_alpha_quantiles: torch.Tensor  # [L, H, dk, Q] per key channel
    head_log_alpha_quantiles: torch.Tensor  # [L, H, Q] over the head's channels too
    hist_edges: torch.Tensor  # [bins + 1] alpha bin edges, shared by all blocks and heads
    hist_counts: torch.Tensor  # [L, H, bins] alpha counts over images, tokens and channels
    log_alpha_by_type: dict[str, torch.Tensor]  # token group -> [L, H, dk]
    log_alpha_map: torch.Tensor  # [L, H, gh, gw] mean log gate of each patch over images and channels

    @property
    def alpha(self) -> torch.Tensor:
        """Geometric-mean gate per key channel [L, H, dk]."""
        return self.log_alpha.exp()

    @property
    def half_life(self) -> torch.Tensor:
        """Half-life in tokens per key channel [L, H, dk]."""
        return half_life(self.log_alpha)

    @property
    def alpha_quantiles(self) -> torch.Tensor:
        """Gate quantiles per key channel [L, H, dk, Q]."""
        return self.log_alpha_quantiles.exp()

    @property
    def half_life_quantiles(self) -> torch.Tensor:
        """Half-life quantiles per key channel [L, H, dk, Q]."""
        return half_life(self.log_alpha_quantiles)

    @property
    def half_life_by_type(self) -> dict[str, torch.Tensor]:
        """Half-life per key channel [L, H, dk] of each token group ("patches", "register_j", "cls")."""
        return {name: half_life(g) for name, g in self.log_alpha_by_type.items()}

    @property
    def head_half_life_by_type(self) -> dict[str, torch.Tensor]:
        """Half-life per head [L, H] of each token group (log gate averaged over the key channels)."""
        return {name: half_life(g.mean(-1)) for name, g in self.log_alpha_by_type.items()}

    @property
    def half_life_map(self) -> torch.Tensor:
        """Half-life per head over the patch grid [L, H, gh, gw]."""
        return half_life(self.log_alpha_map)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (infinite half-lives as None)."""
        return {
            "blocks": self.blocks,
            "layout": layout_dict(self.layout),
            "grid_size": list(self.grid_size),
            "quantile_levels": self.quantile_levels.tolist(),
            "head_alpha_quantiles": json_ready(self.head_log_alpha_quantiles.exp()),
            "head_half_life_quantiles": json_ready(half_life(self.head_log_alpha_quantiles)),
            "histogram": {"alpha_edges": self.hist_edges.tolist(), "counts": self.hist_counts.tolist()},
            "half_life_unit": "tokens (ln 0.5 / ln α: steps until a memory decays to half)",
            "half_life": json_ready(self.half_life),
            "head_half_life_by_type": {name: json_ready(h) for name, h in self.head_half_life_by_type.items()},
            "half_life_map": json_ready(self.half_life_map),
        }


def _distribution(
    log_gates: torch.Tensor, levels: torch.Tensor, bins: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Nearest-rank quantiles of the log gates [L, B, T, H, dk] per key channel [L, H, dk, Q] and per head [L, H, Q],
    and an alpha histogram over their whole range: edges [bins + 1], counts [L, H, bins] (last bin closed). One
    block at a time in float64, so the sorts need one block's memory."""
    lo, hi = float(log_gates.min().double().exp()), float(log_gates.max().double().exp())
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    edges = torch.linspace(lo, hi, bins + 1, dtype=torch.float64, device=log_gates.device)
    channel_q, head_q, counts = [], [], []
    for block in log_gates:
        per_channel = block.double().permute(2, 3, 0, 1).flatten(2)  # [H, dk, B*T]
        channel_q.append(nearest_rank_quantiles(per_channel, levels))
        head_q.append(nearest_rank_quantiles(per_channel.flatten(1), levels))
        alpha = per_channel.flatten(1).exp()
        index = torch.bucketize(alpha, edges[1:-1], right=True)
        zeros = torch.zeros(alpha.shape[0], bins, dtype=torch.long, device=alpha.device)
        counts.append(zeros.scatter_add_(-1, index, torch.ones_like(index)))
    return torch.stack(channel_q), torch.stack(head_q), edges, torch.stack(counts)


QUANTILE_IMAGES = 256  # the gate quantiles and histogram are taken over at most this many (the first) images


def gate_statistics(
    model: HookedModel,
    images: Images,
    bins: int = 32,
    quantiles: Sequence[float] = QUANTILES,
    *,
    batch_size: int | None = None,
    quantile_images: int = QUANTILE_IMAGES,
    over_ranks: bool = False,
) -> GateStats:
    """Forget-gate values, distribution and half-lives of every GLA block of `model` on `images`, streamed in
    batches of `batch_size` on the model's device. Means, token-type and patch maps run over all images; the
    quantiles and the histogram over the first `quantile_images` (exact nearest-rank there: they need every value).
    With `over_ranks`, `images` are this rank's shard and the statistics cover every rank's (distributed_stats).
    """
    blocks = gla_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no GLA blocks; gate statistics need LKAT-style attention")
    names = [f"blocks.{i}.attn.hook_gk" for i in blocks]
    layout = model.token_layout
    grid = tuple(model.patch_embed.grid_size)
    groups = token_groups(layout)
    images_seen, tokens, sums, by_type, patch_sums = 0, 0, 0.0, dict.fromkeys(groups, 0.0), 0.0
    kept, kept_images = [], 0
    for batch in batches(images, batch_size):
        _, cache = model.run_with_cache(on_model(model, batch), names=names)
        gk32 = torch.stack([cache[n] for n in names])  # [L, B, T, H, dk], the model's float32 log gates
        gk = gk32.double()
        images_seen, tokens = images_seen + gk.shape[1], tokens + gk.shape[1] * gk.shape[2]
        sums = sums + gk.sum((1, 2))
        by_type = {name: by_type[name] + gk[:, :, s].sum((1, 2)) for name, s in groups.items()}
        patch_sums = patch_sums + gk[:, :, layout["patches"]].sum((1, 4))  # [L, N, H]
        if kept_images < quantile_images:
            kept.append(gk32[:, : quantile_images - kept_images])  # float32: half the memory, the same values
            kept_images += kept[-1].shape[1]
    first = torch.cat(kept, dim=1)
    if over_ranks:
        images_seen, tokens = (distributed_stats.count_over_ranks(n) for n in (images_seen, tokens))
        sums, patch_sums = (distributed_stats.sum_over_ranks(t) for t in (sums, patch_sums))
        by_type = {name: distributed_stats.sum_over_ranks(t) for name, t in by_type.items()}
        first = distributed_stats.first_over_ranks(first, quantile_images, dim=1)
    levels = torch.tensor(quantiles, dtype=torch.float64)
    channel_quantiles, head_quantiles, edges, counts = _distribution(first, levels, bins)
    channels = kept[0].shape[-1]
    return GateStats(
        blocks=blocks,
        layout=layout,
        grid_size=grid,
        log_alpha=sums / tokens,
        quantile_levels=levels,
        log_alpha_quantiles=channel_quantiles,
        head_log_alpha_quantiles=head_quantiles,
        hist_edges=edges,
        hist_counts=counts,
        log_alpha_by_type={name: by_type[name] / (images_seen * (s.stop - s.start)) for name, s in groups.items()},
        log_alpha_map=(patch_sums / (images_seen * channels)).transpose(1, 2).unflatten(-1, grid),
    )
