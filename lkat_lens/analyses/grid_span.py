"""How much of each KAN layer's RBF grid its real inputs occupy: the share of [grid_min, grid_max] inside each
input channel's [1 %, 99 %] quantile range, averaged over channels. Near 0 the inputs sit in a sliver of the grid
and every edge function is only ever read there (its drawn curve says little about the model)."""

from __future__ import annotations

import torch
from torch import nn

from . import distributed_stats
from .batching import Images, batches, on_model
from .parts import eval_mode, kan_layers

SPAN_QUANTILE = 0.01  # a channel's span is its [1 %, 99 %] quantile range
SLIVER = 0.1  # inputs occupying less than this share of the grid sit in a sliver of it


def grid_span_share(x: torch.Tensor, grid_min: float, grid_max: float, q: float = SPAN_QUANTILE) -> float:
    """Mean over input channels of the share of [grid_min, grid_max] covered by the channel's [q, 1-q] quantile
    range; x is [..., in]. 0: every channel sits on one point (or off the grid), 1: each spans the whole grid."""
    x = x.detach().reshape(-1, x.shape[-1]).double()
    levels = torch.tensor([q, 1.0 - q], dtype=torch.float64, device=x.device)
    lo, hi = torch.quantile(x, levels, dim=0)
    covered = (hi.clamp(grid_min, grid_max) - lo.clamp(grid_min, grid_max)).clamp_min(0)
    return float(covered.mean() / (grid_max - grid_min))


def is_sliver(share: float) -> bool:
    """Whether inputs occupying `share` of the grid sit in a sliver of it."""
    return share < SLIVER


SPAN_IMAGES = 64  # the quantiles are taken over at most this many (the first) images (64 x tokens per channel)


@torch.no_grad()
def layer_span_shares(
    model: nn.Module,
    images: Images,
    *,
    batch_size: int | None = None,
    max_images: int = SPAN_IMAGES,
    over_ranks: bool = False,
) -> dict[str, float]:
    """grid_span_share of every KAN layer's inputs (its hook_in) on the first `max_images` of `images`, fed in
    batches of `batch_size` on the model's device, by layer name. With `over_ranks`, `images` are this rank's shard
    and the first `max_images` are those of every rank's in rank order (distributed_stats)."""
    layers = kan_layers(model)
    if not layers:
        return {}
    names = [f"{name}.hook_in" for name in layers]
    kept: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    seen = 0
    with eval_mode(model):
        for batch in batches(images, batch_size):
            if seen >= max_images:
                break
            batch = batch[: max_images - seen]
            _, cache = model.run_with_cache(on_model(model, batch), names=names)
            for name in names:
                kept[name].append(cache[name])
            seen += batch.shape[0]
    first = {name: torch.cat(found) for name, found in kept.items()}
    if over_ranks:
        first = {name: distributed_stats.first_over_ranks(x, max_images) for name, x in first.items()}
    return {
        name: grid_span_share(first[f"{name}.hook_in"], layer.rbf.grid_min, layer.rbf.grid_max)
        for name, layer in layers.items()
    }
