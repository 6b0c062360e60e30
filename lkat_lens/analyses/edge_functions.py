"""KAN edge functions of RBF-KAN layers: curves in factorised form, importance, coverage, shape diversity.

A layer's edge function is phi_{q,p}(x) = sum_g c_{qp,g} phi_g(x) on the layer's input after its optional
LayerNorm (`hook_in`), with c_{qp} = W[q,p] w (shared), W[q,p] w_p (channel) or W[q,p,:] (edge). Nothing
of size [out, in, points] is built for a whole layer: curves are evaluated for chosen edges, and per-edge
importance (pykan's score: the standard deviation of phi_{q,p}(x_p) over samples) comes exactly from the
streamed mean and covariance of the basis vector b(x_p) of each input channel p:
Var phi_{q,p} = c_{qp}^T Cov_p c_{qp}. With a SiLU base branch the feature vector of channel p is
[b(x_p), silu(x_raw_p)] and the edge's coefficient vector gains w_b[q,p], so the same covariance gives the
spline, base and total edge scores. Samples are tokens (all tokens of all images).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lkat_lens.models.kan import KAN, KANLayer

from . import distributed_stats
from .parts import eval_mode, kan_layers
from .serialize import json_ready
from .symbolic import SymbolicFitResult, SymbolicFunction, fit_symbolic

BASIS_NOTES = {
    "shared": "shared basis: every edge is W[q,p] times one curve sum_g w_g phi_g(x), so all edges have one shape "
    "and shape diversity is trivial",
    "channel": "channel basis: one curve per input channel p; edge (q,p) is W[q,p] times the curve of channel p",
    "edge": "edge basis: an independent curve per edge (q,p)",
}
BASE_NOTE = (
    "SiLU base branch: edge (q,p) adds w_b[q,p] * silu(x_p) on the raw layer input (before the layer's LayerNorm, "
    "if any); its bias b_q is added once per output node, not per edge"
)
GATED_NOTE = (
    "gated residual gamma * sigmoid(gamma) with gamma = W_gamma x + b mixes all inputs in every output, so it is "
    "not edge-separable; reported as weight norms and its contribution to each output"
)
EdgeList = Sequence[tuple[int, int]] | torch.Tensor  # (q, p) pairs
CURVE_MARGIN = 2.0  # the x-grid covers the RBF grid plus this many bandwidths either side
DEFAULT_BINS = 64
_CHUNK_ELEMENTS = 1 << 20  # float64 elements per streamed chunk (8 MiB: blocks the allocator reuses) on the CPU ...
_CUDA_CHUNK_ELEMENTS = 1 << 24  # ... and on a GPU (128 MiB: a few large kernels, not thousands of launches)


def _chunk_elements(device: torch.device) -> int:
    """float64 elements per streamed chunk on `device`."""
    return _CUDA_CHUNK_ELEMENTS if device.type == "cuda" else _CHUNK_ELEMENTS


# ---------------------------------------------------------------------------------------------- curves


def curve_grid(layer: KANLayer, num_points: int = 201, margin: float = CURVE_MARGIN) -> torch.Tensor:
    """The x-grid [num_points] (float64) over [grid_min - margin h, grid_max + margin h]."""
    pad = margin * layer.bandwidth
    return torch.linspace(layer.grid_min - pad, layer.grid_max + pad, num_points, dtype=torch.float64)


def _factor_coefficients(layer: KANLayer) -> torch.Tensor | None:
    """The grid weights of the factor curves, [1, G] (shared) or [in, G] (channel), float64; None for edge."""
    return None if layer.basis == "edge" else layer.spline_factors()[1]


def _edge_index(layer: KANLayer, edges: EdgeList | None, max_edges: int) -> torch.Tensor:
    """Validated edge list [E, 2] of (q, p); None means every edge of a small layer."""
    n_out, n_in = layer.out_features, layer.in_features
    if edges is None:
        if n_out * n_in > max_edges:
            raise ValueError(
                f"layer has {n_out * n_in} edges (more than max_edges={max_edges}); pass edges=[(q, p), ...]"
            )
        return torch.cartesian_prod(torch.arange(n_out), torch.arange(n_in)).reshape(-1, 2)
    index = torch.as_tensor(edges, dtype=torch.long).reshape(-1, 2)
    bad = (index < 0).any(1) | (index[:, 0] >= n_out) | (index[:, 1] >= n_in)
    if bad.any():
        raise ValueError(f"edges {index[bad].tolist()} are outside [0, {n_out}) x [0, {n_in})")
    return index


@dataclass
class GatedBranch:
    """The gated residual's weights: not edge-separable, so reported by norms."""

    weight_norm: float  # ||W_gamma||_F
    bias_norm: float
    row_norms: torch.Tensor  # [out] ||W_gamma[q, :]||
    note: str = GATED_NOTE


def gated_branch(layer: KANLayer) -> GatedBranch | None:
    """Weight norms of the layer's gated residual (None when the layer has none)."""
    if layer.gate_weight is None:
        return None
    weight, bias = layer.gate_weight
    return GatedBranch(
        weight_norm=float(weight.norm()),
        bias_norm=float(bias.norm()),
        row_norms=weight.norm(dim=1),
    )


@dataclass
class EdgeCurves:
    """Edge functions phi_{q,p}(x) of one layer on an x-grid, with the factorised form they come from."""

    basis: str
    x: torch.Tensor  # [P] float64
    edges: torch.Tensor  # [E, 2] (q, p)
    values: torch.Tensor  # [E, P] spline edge functions phi_{q,p}(x)
    factor_curves: torch.Tensor | None  # shared [1, P]: the one curve; channel [in, P]: one per input; edge: None
    scales: torch.Tensor | None  # [E] W[q,p]: values = scales * factor curve (shared/channel)
    base_values: torch.Tensor | None  # [E, P] w_b[q,p] * silu(x) (SiLU base branch on the raw input)
    base_bias: torch.Tensor | None  # [E] b_q of the base branch, added once per output node
    gated: GatedBranch | None
    centers: torch.Tensor  # [G]
    bandwidth: float
    note: str

    @property
    def total(self) -> torch.Tensor:
        """Spline plus base edge functions [E, P] (the base reads the raw input: see BASE_NOTE)."""
        return self.values if self.base_values is None else self.values + self.base_values


def edge_curves(
    layer: KANLayer,
    edges: EdgeList | None = None,
    x: torch.Tensor | None = None,
    num_points: int = 201,
    max_edges: int = 4096,
) -> EdgeCurves:
    """Evaluate phi_{q,p}(x) for the given edges (default: all, for layers up to max_edges edges)."""
    index = _edge_index(layer, edges, max_edges)
    x = curve_grid(layer, num_points) if x is None else x.detach().double().flatten().cpu()
    device = layer.centers.device
    phi = layer.basis_values(x.to(device))
    q, p = index[:, 0].to(device), index[:, 1].to(device)
    values = layer.spline_coefficients(q, p) @ phi.T
    factors = _factor_coefficients(layer)
    scales = None if factors is None else layer.spline_factors()[0][q, p]
    base_values = base_bias = None
    note = BASIS_NOTES[layer.basis]
    if layer.base_weight is not None:
        base_weight, bias = layer.base_weight
        base_values = base_weight[q, p].unsqueeze(-1) * F.silu(x.to(device))
        base_bias = bias[q]
        note += "; " + BASE_NOTE
    gated = gated_branch(layer)
    if gated is not None:
        note += "; " + GATED_NOTE
    return EdgeCurves(
        basis=layer.basis,
        x=x,
        edges=index,
        values=values.cpu(),
        factor_curves=None if factors is None else (factors @ phi.T).cpu(),
        scales=None if scales is None else scales.cpu(),
        base_values=None if base_values is None else base_values.cpu(),
        base_bias=None if base_bias is None else base_bias.cpu(),
        gated=gated,
        centers=layer.centers.double().cpu(),
        bandwidth=layer.bandwidth,
        note=note,
    )


def fit_edge(
    layer: KANLayer,
    edge: tuple[int, int],
    x: torch.Tensor | None = None,
    library: Mapping[str, SymbolicFunction] | Sequence[str] | None = None,
    **search: Any,
) -> SymbolicFitResult:
    """Symbolic fit of one spline edge function, by default on 201 points of [grid_min, grid_max]."""
    if x is None:
        x = torch.linspace(layer.grid_min, layer.grid_max, 201, dtype=torch.float64)
    curves = edge_curves(layer, [edge], x=x)
    return fit_symbolic(curves.x, curves.values[0], library, **search)


# ------------------------------------------------------------------------------------ streaming moments


class StreamingMoments:
    """Streamed mean and (co)variance over samples from float64 sums of v - K, K = the first batch's mean.

    Fixing the shift K after the first batch makes the sums independent of how the samples are batched and
    keeps them exact to rounding even when the mean is large against the spread. outer=True: samples
    [..., n, F] with co-moments over F; outer=False: samples [n, ...] with variances.
    """

    def __init__(self, outer: bool) -> None:
        self.outer, self.sample_dim = outer, (-2 if outer else 0)
        self.count = 0
        self.shift = self.sum = self.sq = None

    def update(self, samples: torch.Tensor) -> None:
        """Add samples (converted to float64)."""
        n = samples.shape[self.sample_dim]
        if n == 0:
            return
        s = samples.double()
        if self.shift is None:
            self.shift = s.mean(self.sample_dim, keepdim=True)
        d = s - self.shift
        sq = d.transpose(-1, -2) @ d if self.outer else d.square().sum(0)
        total = d.sum(self.sample_dim)
        self.sum = total if self.sum is None else self.sum + total
        self.sq = sq if self.sq is None else self.sq + sq
        self.count += n

    def combine_over_ranks(self) -> None:
        """Make these sums cover the samples of every rank (distributed_stats): each rank re-centres its sums on
        the count-weighted mean of the ranks' shifts, then the sums are added (exact up to float64 rounding)."""
        if not distributed_stats.active():
            return
        if self.count == 0:
            raise ValueError("every rank needs samples to combine streamed moments")
        total = distributed_stats.count_over_ranks(self.count)
        shift = distributed_stats.sum_over_ranks(self.shift * self.count) / total
        d = (self.shift - shift).squeeze(self.sample_dim)  # this rank's shift minus the common one
        sq = self.sq + self.count * (d.unsqueeze(-1) * d.unsqueeze(-2) if self.outer else d.square())
        if self.outer:
            sq = sq + self.sum.unsqueeze(-1) * d.unsqueeze(-2) + d.unsqueeze(-1) * self.sum.unsqueeze(-2)
        else:
            sq = sq + 2 * d * self.sum
        self.sum = distributed_stats.sum_over_ranks(self.sum + self.count * d)
        self.sq = distributed_stats.sum_over_ranks(sq)
        self.shift, self.count = shift, total

    @property
    def mean(self) -> torch.Tensor:
        """The mean over all samples seen."""
        return self.shift.squeeze(self.sample_dim) + self.sum / self.count

    def covariance(self) -> torch.Tensor:
        """Unbiased covariance (outer) or variance, as torch.std/var with correction 1."""
        if self.count < 2:
            raise ValueError(f"need at least 2 samples for a variance, got {self.count}")
        spread = self.sum.unsqueeze(-1) * self.sum.unsqueeze(-2) if self.outer else self.sum.square()
        return (self.sq - spread / self.count) / (self.count - 1)


@dataclass
class Coverage:
    """Where a layer's real inputs fall relative to its RBF grid."""

    bin_edges: torch.Tensor  # [bins + 1] over [grid_min - margin h, grid_max + margin h]
    counts: torch.Tensor  # [bins] int64 (last bin closed)
    underflow: int  # inputs below bin_edges[0]
    overflow: int  # inputs above bin_edges[-1]
    support: tuple[float, float]  # [grid_min - h, grid_max + h]: outside it every Gaussian is below exp(-1)
    outside_fraction: float  # fraction of all inputs outside `support`
    channel_outside_fraction: torch.Tensor  # [in]
    total: int  # number of inputs counted (samples x channels)


@dataclass
class LayerStatistics:
    """Streamed statistics of one KAN layer over real inputs: basis moments, output moments, coverage."""

    name: str
    count: int  # samples (tokens)
    feature_mean: torch.Tensor  # [in, F] E[b(x_p)] (then E[silu(x_raw_p)] when the layer has a base branch)
    feature_cov: torch.Tensor  # [in, F, F] unbiased covariance of the feature vector per input channel
    input_mean: torch.Tensor  # [in] mean of the edge-function input x_p (hook_in)
    input_std: torch.Tensor  # [in]
    output_mean: torch.Tensor  # [out] mean of the layer output (hook_out, every branch)
    output_std: torch.Tensor  # [out]
    gated_std: torch.Tensor | None  # [out] std of the gated residual's contribution
    coverage: Coverage


class LayerMoments:
    """Accumulates LayerStatistics of one layer from (x_in, x_raw, out) batches."""

    def __init__(self, layer: KANLayer, name: str = "", *, bins: int = DEFAULT_BINS, margin: float = CURVE_MARGIN):
        self.layer, self.name = layer, name
        h = layer.bandwidth
        self.range = (layer.grid_min - margin * h, layer.grid_max + margin * h)
        self.support = (layer.grid_min - h, layer.grid_max + h)
        self.bins = bins
        self.features = StreamingMoments(outer=True)
        self.inputs = StreamingMoments(outer=False)
        self.outputs = StreamingMoments(outer=False)
        self.gated = StreamingMoments(outer=False) if layer.gate_weight is not None else None
        self.counts: torch.Tensor | None = None
        self.underflow = self.overflow = 0
        self.outside: torch.Tensor | None = None

    @property
    def needs_raw(self) -> bool:
        """Whether update() needs the raw layer input (base branch or gated residual)."""
        return self.layer.base_weight is not None or self.layer.gate_weight is not None

    def update(self, x_in: torch.Tensor, out: torch.Tensor, x_raw: torch.Tensor | None = None) -> None:
        """Add a batch: x_in = hook_in [..., in], out = hook_out [..., out], x_raw = the layer's input."""
        if self.needs_raw and x_raw is None:
            raise ValueError(f"layer {self.name!r} has a base branch or gated residual: pass x_raw")
        layer = self.layer
        x_in = x_in.detach().reshape(-1, layer.in_features)
        raw = None if x_raw is None else x_raw.detach().reshape(-1, layer.in_features)
        rows = max(1, _chunk_elements(x_in.device) // (layer.in_features * (layer.num_grids + 1)))
        for start in range(0, x_in.shape[0], rows):
            chunk = x_in[start : start + rows].double()
            raw_chunk = None if raw is None else raw[start : start + rows]
            self.features.update(self._features(chunk, raw_chunk))
            self.inputs.update(chunk)
            self._count(chunk)
            if self.gated is not None:
                self.gated.update(layer.gated_contribution(raw_chunk))
        self.outputs.update(out.detach().reshape(-1, layer.out_features))

    def _features(self, x: torch.Tensor, raw: torch.Tensor | None) -> torch.Tensor:
        """Feature vectors [in, n, F]: the basis b(x_p), then silu(x_raw_p) when there is a base branch."""
        phi = self.layer.basis_values(x.T)
        if self.layer.base_weight is None:
            return phi
        return torch.cat([phi, F.silu(raw.T.double()).unsqueeze(-1)], dim=-1)

    def _count(self, x: torch.Tensor) -> None:
        """Histogram, under/overflow and per-channel outside-support counts of inputs x [n, in] (float64)."""
        lo, hi = self.range
        counts = torch.histc(x, bins=self.bins, min=lo, max=hi).round().long()
        outside = ((x < self.support[0]) | (x > self.support[1])).sum(0)
        self.counts = counts if self.counts is None else self.counts + counts
        self.outside = outside if self.outside is None else self.outside + outside
        self.underflow += int((x < lo).sum())
        self.overflow += int((x > hi).sum())

    def combine_over_ranks(self) -> None:
        """Make the statistics cover the samples of every rank (distributed_stats; a no-op without one)."""
        for moments in (self.features, self.inputs, self.outputs, self.gated):
            if moments is not None:
                moments.combine_over_ranks()
        self.counts = distributed_stats.sum_over_ranks(self.counts)
        self.outside = distributed_stats.sum_over_ranks(self.outside)
        self.underflow = distributed_stats.count_over_ranks(self.underflow)
        self.overflow = distributed_stats.count_over_ranks(self.overflow)

    def statistics(self) -> LayerStatistics:
        """The statistics of everything seen so far."""
        if self.features.count < 2:
            raise ValueError(f"layer {self.name!r} saw {self.features.count} samples; need at least 2")
        total = self.features.count * self.layer.in_features
        coverage = Coverage(
            bin_edges=torch.linspace(*self.range, self.bins + 1, dtype=torch.float64),
            counts=self.counts.cpu(),
            underflow=self.underflow,
            overflow=self.overflow,
            support=self.support,
            outside_fraction=float(self.outside.sum()) / total,
            channel_outside_fraction=(self.outside.double() / self.features.count).cpu(),
            total=total,
        )
        return LayerStatistics(
            name=self.name,
            count=self.features.count,
            feature_mean=self.features.mean,
            feature_cov=self.features.covariance(),
            input_mean=self.inputs.mean,
            input_std=self.inputs.covariance().sqrt(),
            output_mean=self.outputs.mean,
            output_std=self.outputs.covariance().sqrt(),
            gated_std=None if self.gated is None else self.gated.covariance().sqrt(),
            coverage=coverage,
        )


def _batches(inputs: torch.Tensor | Iterable[torch.Tensor], batch_size: int | None) -> Iterator[torch.Tensor]:
    """Split one tensor into batches of batch_size, or pass an iterable of batches through."""
    if isinstance(inputs, torch.Tensor):
        yield from (inputs.split(batch_size) if batch_size else (inputs,))
    else:
        yield from inputs


@contextmanager
def _capture(layers: dict[str, KANLayer], moments: dict[str, LayerMoments]) -> Iterator[None]:
    """Feed each layer's hook_in / hook_out (and raw input when needed) into its LayerMoments during forwards."""
    handles = []
    for name, layer in layers.items():
        acc, pending = moments[name], {}

        def keep_raw(module: nn.Module, args: tuple, pending: dict = pending) -> None:
            pending["raw"] = args[0]

        def keep_in(module: nn.Module, args: tuple, out: torch.Tensor, pending: dict = pending) -> None:
            pending["in"] = out

        def consume(module: nn.Module, args: tuple, out: torch.Tensor, acc=acc, pending: dict = pending) -> None:
            acc.update(pending.pop("in"), out, pending.pop("raw", None))

        if acc.needs_raw:
            handles.append(layer.register_forward_pre_hook(keep_raw))
        handles.append(layer.hook_in.register_forward_hook(keep_in))
        handles.append(layer.hook_out.register_forward_hook(consume))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def layer_statistics(
    model: nn.Module,
    inputs: torch.Tensor | Iterable[torch.Tensor],
    *,
    layers: Sequence[str] | None = None,
    batch_size: int | None = None,
    bins: int = DEFAULT_BINS,
    margin: float = CURVE_MARGIN,
    over_ranks: bool = False,
) -> dict[str, LayerStatistics]:
    """Stream inputs through the model (eval mode, no grad) and collect statistics of its KAN layers; with
    `over_ranks`, `inputs` are this rank's shard and the statistics cover every rank's (distributed_stats)."""
    found = kan_layers(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no KANLayer")
    if layers is not None:
        unknown = [n for n in layers if n not in found]
        if unknown:
            raise KeyError(f"no KAN layers {unknown}; the model has {list(found)}")
        found = {n: found[n] for n in layers}
    moments = {name: LayerMoments(layer, name, bins=bins, margin=margin) for name, layer in found.items()}
    device = next(model.parameters()).device
    with eval_mode(model), torch.no_grad(), _capture(found, moments):
        for batch in _batches(inputs, batch_size):
            model(batch.to(device))
    if over_ranks:
        for acc in moments.values():
            acc.combine_over_ranks()
    return {name: acc.statistics() for name, acc in moments.items()}


# ------------------------------------------------------------------------------------------- importance


def _reduced_form(layer: KANLayer, stats: LayerStatistics) -> tuple[torch.Tensor, int]:
    """Per-channel covariance in the coordinates of the edge coefficients [in, k, k], and the spline size k_s.

    shared/channel: coordinates (W[q,p], w_b[q,p]) after projecting the basis on the channel's curve;
    edge: coordinates (W[q,p,:], w_b[q,p]).
    """
    cov = stats.feature_cov
    if layer.basis == "edge":
        return cov, layer.num_grids
    n_in, n_feat = cov.shape[0], cov.shape[-1]
    weights = _factor_coefficients(layer).to(cov.device).expand(n_in, -1)
    projection = torch.zeros(n_in, n_feat, n_feat - layer.num_grids + 1, dtype=cov.dtype, device=cov.device)
    projection[:, : layer.num_grids, 0] = weights
    if n_feat > layer.num_grids:
        projection[:, -1, 1] = 1.0
    return projection.transpose(1, 2) @ cov @ projection, 1


def _coefficients(layer: KANLayer, rows: slice) -> torch.Tensor:
    """Edge coefficients [r, in, k] (float64) of output rows `rows` in the coordinates of _reduced_form."""
    spline = layer.spline_coefficients(rows) if layer.basis == "edge" else layer.spline_factors()[0][rows].unsqueeze(-1)
    if layer.base_weight is None:
        return spline
    return torch.cat([spline, layer.base_weight[0][rows].unsqueeze(-1)], dim=-1)


def _edge_variances(layer: KANLayer, reduced: torch.Tensor, k_spline: int) -> tuple[torch.Tensor, ...]:
    """Variances [out, in] of the total, spline and base edge functions (base None without a base branch)."""
    k = reduced.shape[-1]
    rows = max(1, _chunk_elements(reduced.device) // (layer.in_features * k))
    total, spline, base = [], [], []
    for start in range(0, layer.out_features, rows):
        c = _coefficients(layer, slice(start, start + rows)).to(reduced.device)
        cs = c[..., :k_spline]
        spline.append(torch.einsum("qpk,pkl,qpl->qp", cs, reduced[:, :k_spline, :k_spline], cs))
        if k > k_spline:
            total.append(torch.einsum("qpk,pkl,qpl->qp", c, reduced, c))
            base.append(c[..., -1].square() * reduced[:, -1, -1])
    spline_var = torch.cat(spline)
    if not base:
        return spline_var, spline_var, None
    return torch.cat(total), spline_var, torch.cat(base)


def _top_edges(scores: torch.Tensor, k: int) -> list[tuple[int, int, float]]:
    """The k largest entries of an [out, in] matrix as (q, p, score), largest first."""
    values, flat = scores.flatten().topk(min(k, scores.numel()))
    n_in = scores.shape[1]
    return [(int(i) // n_in, int(i) % n_in, float(v)) for v, i in zip(values, flat, strict=True)]


def _top_nodes(scores: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The k largest entries of a vector as (index, score), largest first."""
    values, index = scores.topk(min(k, scores.numel()))
    return [(int(i), float(v)) for v, i in zip(values, index, strict=True)]


@dataclass
class EdgeImportance:
    """pykan's edge scores of one layer: the std over samples of each edge function phi_{q,p}(x_p)."""

    name: str
    edge_std: torch.Tensor  # [out, in] spline + base edge function
    spline_std: torch.Tensor  # [out, in] spline part only (edge_std itself without a base branch)
    base_std: torch.Tensor | None  # [out, in] base part w_b[q,p] silu(x_raw_p) only
    output_std: torch.Tensor  # [out] std of the layer output nodes (every branch)

    @property
    def input_importance(self) -> torch.Tensor:
        """Per input channel: the summed std of its outgoing edges, sum_q edge_std[q, p]."""
        return self.edge_std.sum(0)

    @property
    def output_importance(self) -> torch.Tensor:
        """Per output node: the std of its value over samples."""
        return self.output_std

    def top_edges(self, k: int = 10) -> list[tuple[int, int, float]]:
        """The k edges with the largest std as (q, p, std)."""
        return _top_edges(self.edge_std, k)

    def top_inputs(self, k: int = 10) -> list[tuple[int, float]]:
        """The k input channels with the largest input_importance as (p, score)."""
        return _top_nodes(self.input_importance, k)

    def top_outputs(self, k: int = 10) -> list[tuple[int, float]]:
        """The k output nodes with the largest std as (q, std)."""
        return _top_nodes(self.output_std, k)


def edge_importance(layer: KANLayer, stats: LayerStatistics) -> EdgeImportance:
    """Exact per-edge std of phi_{q,p}(x_p) over the samples summarised by stats, for every edge at once."""
    reduced, k_spline = _reduced_form(layer, stats)
    total, spline, base = _edge_variances(layer, reduced, k_spline)
    spline_std = spline.clamp_min(0).sqrt()
    return EdgeImportance(
        name=stats.name,
        edge_std=spline_std if base is None else total.clamp_min(0).sqrt(),
        spline_std=spline_std,
        base_std=None if base is None else base.clamp_min(0).sqrt(),
        output_std=stats.output_std,
    )


def top_edge_curves(layer: KANLayer, stats: LayerStatistics, k: int) -> tuple[EdgeCurves, list[float]]:
    """Curves of the layer's k most important edges on the default grid, and their importance (std)."""
    top = edge_importance(layer, stats).top_edges(k)
    curves = edge_curves(layer, [(q, p) for q, p, _ in top])
    return curves, [score for _, _, score in top]


@dataclass
class KANAttribution:
    """pykan-style attribution: node scores propagated from the outputs back through the edge scores."""

    layer_names: list[str]
    node_scores: list[torch.Tensor]  # L+1 vectors: inputs of layer 0, ..., outputs of layer L-1
    edge_scores: list[torch.Tensor]  # L matrices [out_l, in_l]

    @property
    def input_score(self) -> torch.Tensor:
        """Scores of the input channels of the first layer (pykan's feature_score)."""
        return self.node_scores[0]

    def top_inputs(self, k: int = 10) -> list[tuple[int, float]]:
        """The k input channels with the largest attribution as (p, score)."""
        return _top_nodes(self.node_scores[0], k)

    def top_nodes(self, level: int, k: int = 10) -> list[tuple[int, float]]:
        """The k nodes of a level (0 = inputs, L = outputs) with the largest attribution."""
        return _top_nodes(self.node_scores[level], k)

    def top_edges(self, layer: int, k: int = 10) -> list[tuple[int, int, float]]:
        """The k edges of layer `layer` with the largest attribution as (q, p, score)."""
        return _top_edges(self.edge_scores[layer], k)


def kan_attribution(
    importances: Sequence[EdgeImportance], out_score: torch.Tensor | None = None, eps: float = 0.0
) -> KANAttribution:
    """Propagate output scores back through consecutive layers (first to last), as pykan's attribute().

    edge_score[q,p] = edge_std[q,p] * node_score_out[q] / (output_std[q] + eps); node_score_in[p] is its sum
    over q. The default out_score, uniform 1/out, gives pykan's node_scores/edge_scores (its mean over the
    identity of output queries). pykan uses eps = 1e-4; the default 0 scores nodes of zero std as 0.
    """
    if not importances:
        raise ValueError("need at least one layer")
    last = importances[-1]
    n_out = last.edge_std.shape[0]
    score = torch.full((n_out,), 1.0 / n_out, dtype=torch.float64, device=last.edge_std.device)
    if out_score is not None:
        score = out_score.to(score)
        if score.shape != (n_out,):
            raise ValueError(f"out_score must have shape ({n_out},), got {tuple(out_score.shape)}")
    nodes, edges = [score], []
    for imp in reversed(importances):
        if imp.edge_std.shape[0] != score.shape[0]:
            raise ValueError(f"layer {imp.name!r} has {imp.edge_std.shape[0]} outputs, expected {score.shape[0]}")
        denom = imp.output_std.double() + eps
        ratio = torch.where(denom > 0, score / denom.clamp_min(1e-300), torch.zeros_like(score))
        edge = imp.edge_std * ratio.unsqueeze(1)
        score = edge.sum(0)
        edges.append(edge)
        nodes.append(score)
    return KANAttribution([imp.name for imp in importances], nodes[::-1], edges[::-1])


# ------------------------------------------------------------------------------------------ shape diversity


@dataclass
class ShapeDiversity:
    """How different the edge-curve shapes of a layer are, with shapes compared up to y -> c y + d.

    Each curve is centred and scaled to unit norm on the x-grid (rows z_i); with lambda the eigenvalues of
    Z^T Z: effective_rank = exp(entropy of sigma_i / sum sigma) for sigma = sqrt(lambda) (1 = one shape,
    at most G), mean_sq_correlation = mean over pairs i != j of corr(z_i, z_j)^2 (1 = one shape).
    """

    basis: str
    num_curves: int  # distinct curves compared (shared 1, channel in, edge out*in)
    num_flat: int  # curves left out because they are constant on the x-grid
    effective_rank: float
    mean_sq_correlation: float
    note: str


def _shape_gram(coefficients: Iterable[torch.Tensor], q_form: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """Sum over curves c of c c^T / (c^T Q c) (Q: Gram of the centred basis), the curve and flat counts."""
    scale = q_form.diagonal().max()
    gram = torch.zeros_like(q_form)
    n = flat = 0
    for c in coefficients:
        norms = ((c @ q_form) * c).sum(-1)
        keep = norms > 1e-24 * scale * c.square().sum(-1)
        flat += int((~keep).sum())
        c = c[keep]
        gram += (c / norms[keep].unsqueeze(-1)).T @ c
        n += c.shape[0]
    return gram, n, flat


def shape_diversity(layer: KANLayer, num_points: int = 201) -> ShapeDiversity:
    """Shape diversity of the layer's spline edge curves on the default x-grid."""
    phi = layer.basis_values(curve_grid(layer, num_points).to(layer.centers.device))
    centred = phi - phi.mean(0)
    if layer.basis == "edge":
        flat_weight = layer.spline_coefficients(slice(None)).reshape(-1, layer.num_grids)
        chunks = iter(flat_weight.split(_CHUNK_ELEMENTS // layer.num_grids))
    else:
        chunks = iter([_factor_coefficients(layer)])
    q_form = centred.T @ centred
    gram, n, flat = _shape_gram(chunks, q_form)
    note = BASIS_NOTES[layer.basis]
    if layer.basis == "channel":
        note += "; diversity is over the channel curves"
    if n < 2:
        return ShapeDiversity(layer.basis, n, flat, float(n), 1.0 if n else math.nan, note)
    evals, evecs = torch.linalg.eigh(q_form)
    root = evecs @ torch.diag(evals.clamp_min(0).sqrt()) @ evecs.T
    lam = torch.linalg.eigvalsh(root @ gram @ root).clamp_min(0)
    sigma = lam.sqrt()
    p = sigma / sigma.sum()
    p = p[p > 0]
    effective_rank = float(torch.exp(-(p * p.log()).sum()))
    mean_sq = float((lam.square().sum() - n) / (n * (n - 1)))
    return ShapeDiversity(layer.basis, n, flat, effective_rank, mean_sq, note)


# ------------------------------------------------------------------------------------------------ summary


def _distribution(scores: torch.Tensor) -> dict[str, float]:
    """Mean, median, max and the share of the total held by the top 1% of entries."""
    flat = scores.flatten()
    top = flat.topk(max(1, flat.numel() // 100)).values
    total = float(flat.sum())
    return {
        "mean": float(flat.mean()),
        "median": float(flat.median()),
        "max": float(top[0]),
        "top1pct_share": float(top.sum()) / total if total > 0 else math.nan,
    }


@dataclass
class LayerSummary:
    """Importance, coverage and diversity of one KAN layer over real inputs."""

    name: str
    basis: str
    in_features: int
    out_features: int
    num_grids: int
    grid: tuple[float, float]
    bandwidth: float
    samples: int
    importance: dict[str, float]  # distribution of edge_std over all edges
    top_edges: list[tuple[int, int, float]]  # (q, p, std)
    top_inputs: list[tuple[int, float]]  # (p, sum_q std)
    top_outputs: list[tuple[int, float]]  # (q, output std)
    coverage: Coverage
    diversity: ShapeDiversity
    base: dict[str, Any] | None  # weight norm and base_std distribution
    gated: dict[str, Any] | None  # weight norms and contribution std relative to the output std
    note: str


@dataclass
class BlockAttribution:
    """pykan-style attribution through one two-layer KAN (fc1 -> fc2) from uniform output scores."""

    name: str
    top_inputs: list[tuple[int, float]]
    top_hidden: list[tuple[int, float]]
    top_edges: dict[str, list[tuple[int, int, float]]]


@dataclass
class EdgeFunctionSummary:
    """Edge-function analysis of every KAN layer of a model over a batch of real inputs."""

    num_images: int
    layers: dict[str, LayerSummary]
    attributions: dict[str, BlockAttribution]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested dict (tensors as lists, NaN as None); top edges and nodes as named fields."""
        out = json_ready(self)
        for layer in out["layers"].values():
            layer["top_edges"] = _named(layer["top_edges"], ("out", "in", "std"))
            layer["top_inputs"] = _named(layer["top_inputs"], ("in", "importance"))
            layer["top_outputs"] = _named(layer["top_outputs"], ("out", "std"))
        for block in out["attributions"].values():
            block["top_inputs"] = _named(block["top_inputs"], ("in", "score"))
            block["top_hidden"] = _named(block["top_hidden"], ("hidden", "score"))
            block["top_edges"] = {k: _named(v, ("out", "in", "score")) for k, v in block["top_edges"].items()}
        return out


def _named(rows: list[list[Any]], fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """Rows of a top-k list as dicts with field names (out = q, the output node; in = p, the input)."""
    return [dict(zip(fields, row, strict=True)) for row in rows]


def summarize_layer(layer: KANLayer, stats: LayerStatistics, top_k: int = 10) -> tuple[LayerSummary, EdgeImportance]:
    """The summary of one layer and its importance (kept for attribution)."""
    imp = edge_importance(layer, stats)
    base = gated = None
    note = BASIS_NOTES[layer.basis]
    if imp.base_std is not None:
        base = {"weight_norm": float(layer.base_weight[0].norm())}
        base |= {"importance": _distribution(imp.base_std), "note": BASE_NOTE}
    branch = gated_branch(layer)
    if branch is not None:
        ratio = stats.gated_std / stats.output_std.clamp_min(1e-300)
        gated = {"weight_norm": branch.weight_norm, "bias_norm": branch.bias_norm}
        gated |= {"contribution_std_mean": float(stats.gated_std.mean()), "std_ratio_mean": float(ratio.mean())}
        gated |= {"note": GATED_NOTE}
    summary = LayerSummary(
        name=stats.name,
        basis=layer.basis,
        in_features=layer.in_features,
        out_features=layer.out_features,
        num_grids=layer.num_grids,
        grid=(layer.grid_min, layer.grid_max),
        bandwidth=layer.bandwidth,
        samples=stats.count,
        importance=_distribution(imp.edge_std),
        top_edges=imp.top_edges(top_k),
        top_inputs=imp.top_inputs(top_k),
        top_outputs=imp.top_outputs(top_k),
        coverage=stats.coverage,
        diversity=shape_diversity(layer),
        base=base,
        gated=gated,
        note=note,
    )
    return summary, imp


def summarize_edge_functions(
    model: nn.Module,
    images: torch.Tensor | Iterable[torch.Tensor],
    *,
    top_k: int = 10,
    batch_size: int | None = None,
    bins: int = DEFAULT_BINS,
    over_ranks: bool = False,
) -> EdgeFunctionSummary:
    """Per block and layer: importance, coverage, shape diversity, top-k edges and pykan attribution (with
    `over_ranks`, `images` are this rank's shard and the summary covers every rank's)."""
    counted: list[int] = []

    def counting(batches: Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
        for batch in batches:
            counted.append(batch.shape[0])
            yield batch

    stats = layer_statistics(model, counting(_batches(images, batch_size)), bins=bins, over_ranks=over_ranks)
    layers = kan_layers(model)
    summaries: dict[str, LayerSummary] = {}
    attributions: dict[str, BlockAttribution] = {}
    for name, module in model.named_modules():
        if isinstance(module, KAN):
            prefix = f"{name}." if name else ""
            pair = []
            for sub in ("fc1", "fc2"):
                summaries[prefix + sub], imp = summarize_layer(layers[prefix + sub], stats[prefix + sub], top_k)
                pair.append(imp)
            attr = kan_attribution(pair)
            attributions[name or "mlp"] = BlockAttribution(
                name=name or "mlp",
                top_inputs=attr.top_inputs(top_k),
                top_hidden=attr.top_nodes(1, top_k),
                top_edges={"fc1": attr.top_edges(0, top_k), "fc2": attr.top_edges(1, top_k)},
            )
    for name, layer_stats in stats.items():
        if name not in summaries:
            summaries[name] = summarize_layer(layers[name], layer_stats, top_k)[0]
    num_images = distributed_stats.count_over_ranks(sum(counted)) if over_ranks else sum(counted)
    return EdgeFunctionSummary(num_images=num_images, layers=summaries, attributions=attributions)
