"""Residual-stream token norms per block and high-norm outlier patches ("Vision Transformers Need Registers").

Darcet et al. find that large ViTs repurpose a few low-information patches as global scratch space: those
tokens' norms sit far above the bulk (a bimodal histogram, cut by eye at 150 for DINOv2). Here the cut is
scale-free and chosen per depth from the patch-norm distribution over all images: a patch is an outlier when
its norm exceeds both `ratio` x the median and the median + `z` robust standard deviations (1.4826 x MAD).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lkat_lens.models.hooks import HookedModel

from . import distributed_stats
from .batching import Images, batches, on_model
from .parts import residual_names

OUTLIER_Z = 5.0
OUTLIER_RATIO = 2.0
MAD_TO_STD = 1.4826  # MAD of a normal distribution times this is its standard deviation


def token_groups(layout: dict[str, slice]) -> dict[str, slice]:
    """Token groups to split statistics by: "patches", each register ("register_0", ...) and "cls" when present."""
    groups = {"patches": layout["patches"]}
    registers = layout.get("registers")
    if registers is not None:
        groups |= {f"register_{j}": slice(t, t + 1) for j, t in enumerate(range(registers.start, registers.stop))}
    if "cls" in layout:
        groups["cls"] = layout["cls"]
    return groups


def layout_dict(layout: dict[str, slice]) -> dict[str, list[int]]:
    """A token layout as JSON: {type: [start, stop]}."""
    return {name: [s.start, s.stop] for name, s in layout.items()}


def outlier_threshold(norms: torch.Tensor, z: float = OUTLIER_Z, ratio: float = OUTLIER_RATIO) -> torch.Tensor:
    """Per leading index, the norm above which a token is an outlier: max(ratio·median, median + z·1.4826·MAD)."""
    median = norms.median(-1).values
    mad = (norms - median.unsqueeze(-1)).abs().median(-1).values
    return torch.maximum(ratio * median, median + z * MAD_TO_STD * mad)


@dataclass
class TokenNorms:
    """L2 norms of residual-stream tokens at depth 0 (hook_embed) and after each block, with outlier patches."""

    norms: torch.Tensor  # [L+1, B, T] fp32; depth d > 0 is the output of block d-1
    layout: dict[str, slice]
    grid_size: tuple[int, int]
    thresholds: torch.Tensor  # [L+1] outlier cut per depth (over all patches of all images)
    outliers: torch.Tensor  # [L+1, B, N] bool, patches above their depth's threshold
    z: float
    ratio: float

    @property
    def patches(self) -> torch.Tensor:
        """Patch-token norms [L+1, B, N]."""
        return self.norms[..., self.layout["patches"]]

    @property
    def patch_maps(self) -> torch.Tensor:
        """Patch-token norms over the patch grid [L+1, B, gh, gw]."""
        return self.patches.unflatten(-1, self.grid_size)

    @property
    def outlier_maps(self) -> torch.Tensor:
        """Outlier flags over the patch grid [L+1, B, gh, gw]."""
        return self.outliers.unflatten(-1, self.grid_size)

    def group_norms(self) -> dict[str, torch.Tensor]:
        """Norms [L+1, B, n] of each token group ("patches", "register_j", "cls")."""
        return {name: self.norms[..., s] for name, s in token_groups(self.layout).items()}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: mean norm per group and depth, thresholds, outlier fractions and positions."""
        flagged = self.outlier_maps.nonzero().tolist()
        return {
            "depths": self.norms.shape[0],
            "layout": layout_dict(self.layout),
            "grid_size": list(self.grid_size),
            "mean_norm": {name: n.mean((1, 2)).tolist() for name, n in self.group_norms().items()},
            "patch_norm_median": self.patches.flatten(1).median(-1).values.tolist(),
            "rule": {"z": self.z, "ratio": self.ratio},
            "threshold": self.thresholds.tolist(),
            "outlier_fraction": self.outliers.float().mean((1, 2)).tolist(),
            "outliers": [dict(zip(("depth", "image", "row", "col"), f, strict=True)) for f in flagged],
        }


def token_norms(
    model: HookedModel,
    images: Images,
    z: float = OUTLIER_Z,
    ratio: float = OUTLIER_RATIO,
    *,
    batch_size: int | None = None,
    over_ranks: bool = False,
) -> TokenNorms:
    """Token L2 norms by depth and high-norm outlier patches of a hooked model (LKAT, rbfKAT, ViT-5, timm ViT),
    streamed in batches of `batch_size` on the model's device (only the norms are kept). With `over_ranks`,
    `images` are this rank's shard and the norms are every rank's, in rank order (distributed_stats)."""
    names = residual_names(model)
    found = []
    for batch in batches(images, batch_size):
        _, cache = model.run_with_cache(on_model(model, batch), names=names)
        found.append(torch.stack([torch.linalg.norm(cache[n].float(), dim=-1) for n in names]))
    norms = torch.cat(found, dim=1)
    if over_ranks:
        norms = distributed_stats.cat_over_ranks(norms, dim=1)
    layout = model.token_layout
    patches = norms[..., layout["patches"]]
    thresholds = outlier_threshold(patches.flatten(1), z, ratio)
    return TokenNorms(
        norms=norms,
        layout=layout,
        grid_size=tuple(model.patch_embed.grid_size),
        thresholds=thresholds,
        outliers=patches > thresholds[:, None, None],
        z=z,
        ratio=ratio,
    )
