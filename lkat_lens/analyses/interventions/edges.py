"""KAN interventions: ablate edge functions φ_{q,p} (a set of edges, an input channel, an output node), prune every
edge under an importance threshold, and swap edges for other curves (their symbolic fits).

A KAN layer's output is y_q = Σ_p φ_{q,p}(x_p), plus w_b[q,p] silu(x_raw_p) per edge with a SiLU base branch and
the gated residual, which mixes all inputs and has no edges (it is never touched). The shared Gaussian basis has no
per-edge parameters, so an edge is not removed by editing weights: its exact contribution, computed in float64 from
the layer's coefficients (`spline_coefficients`, `basis_values`, `base_weight`) on the layer's real input, is
subtracted at the layer's `hook_out`. A swap adds f(x_p) - φ_{q,p}(x_p) there (the spline part; the base part stays).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

from lkat_lens.models.kan import KANLayer

from ..edge_functions import EdgeImportance, edge_importance, fit_edge, layer_statistics
from ..parts import kan_layers
from ..serialize import json_ready
from ..symbolic import SymbolicFit, SymbolicFunction
from .effects import measure

__all__ = [
    "EdgeAblation",
    "EdgeSwap",
    "PruneCurve",
    "SymbolicSwapResult",
    "edge_contributions",
    "layer_importance",
    "prune_masks",
    "prune_sweep",
    "symbolic_swap",
]

CHUNK_ELEMENTS = 1 << 24  # float64 basis values per chunk of tokens (128 MiB)
Curve = Callable[[torch.Tensor], torch.Tensor]  # float64 x -> float64 f(x), elementwise (a SymbolicFit is one)


def kan_layer(model: nn.Module, name: str) -> KANLayer:
    """The KAN layer by module name ("blocks.3.mlp.fc1"); ValueError naming the model's layers otherwise."""
    layers = kan_layers(model)
    if name not in layers:
        raise ValueError(f"no KAN layer {name!r}; the model has {list(layers)}")
    return layers[name]


def _check_edges(layer: KANLayer, edges: torch.Tensor) -> None:
    """ValueError for (q, p) pairs outside the layer."""
    bad = (edges < 0).any(-1) | (edges[:, 0] >= layer.out_features) | (edges[:, 1] >= layer.in_features)
    if bad.any():
        bounds = f"[0, {layer.out_features}) x [0, {layer.in_features})"
        raise ValueError(f"edges {edges[bad].tolist()} are outside {bounds}")


def _edit_output(
    layer: KANLayer, rows: slice, correction: Callable[[torch.Tensor], torch.Tensor | None]
) -> list[RemovableHandle]:
    """Hooks that add correction(raw layer input of `rows`) (float64 [..., out], or None for nothing) to hook_out."""
    raw: dict[str, torch.Tensor] = {}

    def keep_input(module: nn.Module, args: tuple) -> None:
        raw["x"] = args[0][rows].detach()

    def edit(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
        delta = correction(raw.pop("x"))
        if delta is None:
            return None
        out = out.clone()
        out[rows] += delta.to(out.dtype)
        return out

    return [layer.register_forward_pre_hook(keep_input), layer.hook_out.register_forward_hook(edit)]


def edge_contributions(layer: KANLayer, mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Σ_p over the edges marked in mask [out, in] of φ_{q,p}(x_p) (+ the base part w_b[q,p] silu(x_p)) for the raw
    layer input x [..., in]: float64 [..., out]."""
    mask = mask.to(x.device)
    inputs = mask.any(0).nonzero().flatten()
    coefficients = (layer.spline_coefficients(slice(None), inputs) * mask[:, inputs, None]).flatten(1).T  # [P G, out]
    base = None if layer.base_weight is None else (layer.base_weight[0][:, inputs] * mask[:, inputs]).T
    tokens = x.reshape(-1, x.shape[-1])
    rows = max(1, CHUNK_ELEMENTS // max(1, inputs.numel() * layer.num_grids))
    parts = []
    for chunk in tokens.split(rows):  # the basis values [rows, P, G] of a chunk stay under CHUNK_ELEMENTS
        part = layer.basis_values(layer.edge_input(chunk)[:, inputs]).flatten(-2) @ coefficients
        if base is not None:
            part = part + F.silu(chunk[:, inputs].detach().double()) @ base
        parts.append(part)
    return torch.cat(parts).reshape(*x.shape[:-1], layer.out_features)


class EdgeAblation:
    """Remove the edges of a KAN layer marked in mask [out, in] (their spline and base parts) from its output."""

    def __init__(self, layer: str, mask: torch.Tensor, label: str | None = None) -> None:
        self.layer, self.mask = layer, mask.bool().cpu()
        self.label = label or f"{layer}: {int(self.mask.sum())} edges ablated"

    @classmethod
    def edges(cls, model: nn.Module, layer: str, edges: Sequence[tuple[int, int]]) -> EdgeAblation:
        """Ablate the listed (q, p) edges."""
        module = kan_layer(model, layer)
        index = torch.as_tensor(edges, dtype=torch.long).reshape(-1, 2)
        _check_edges(module, index)
        mask = torch.zeros(module.out_features, module.in_features, dtype=torch.bool)
        mask[index[:, 0], index[:, 1]] = True
        pairs = ", ".join(f"φ[{q},{p}]" for q, p in index.tolist())
        return cls(layer, mask, f"{layer} {pairs} ablated" if len(index) <= 3 else None)

    @classmethod
    def input_channel(cls, model: nn.Module, layer: str, channel: int) -> EdgeAblation:
        """Ablate every edge out of input channel p = `channel` (the layer no longer reads it)."""
        module = kan_layer(model, layer)
        if not 0 <= channel < module.in_features:
            raise ValueError(f"input channel {channel} is out of range [0, {module.in_features})")
        mask = torch.zeros(module.out_features, module.in_features, dtype=torch.bool)
        mask[:, channel] = True
        return cls(layer, mask, f"{layer} input channel {channel} ablated")

    @classmethod
    def output_node(cls, model: nn.Module, layer: str, node: int) -> EdgeAblation:
        """Ablate every edge into output node q = `node` (only its gated residual, if any, is left)."""
        module = kan_layer(model, layer)
        if not 0 <= node < module.out_features:
            raise ValueError(f"output node {node} is out of range [0, {module.out_features})")
        mask = torch.zeros(module.out_features, module.in_features, dtype=torch.bool)
        mask[node] = True
        return cls(layer, mask, f"{layer} output node {node} ablated")

    def describe(self) -> str:
        return self.label

    def attach(self, model: nn.Module, rows: slice) -> list[RemovableHandle]:
        layer = kan_layer(model, self.layer)
        if self.mask.shape != (layer.out_features, layer.in_features):
            raise ValueError(
                f"edge mask {tuple(self.mask.shape)} does not fit {self.layer} [{layer.out_features}, "
                f"{layer.in_features}]"
            )
        if not self.mask.any():
            return []

        def remove(x: torch.Tensor) -> torch.Tensor:
            return -edge_contributions(layer, self.mask, x)

        return _edit_output(layer, rows, remove)


class EdgeSwap:
    """Replace spline edge functions φ_{q,p} of a KAN layer by other curves (e.g. their symbolic fits)."""

    def __init__(self, layer: str, curves: Mapping[tuple[int, int], Curve], label: str | None = None) -> None:
        if not curves:
            raise ValueError("EdgeSwap needs at least one (q, p) -> curve")
        self.layer, self.curves = layer, dict(curves)
        self.label = label or f"{layer}: {len(self.curves)} edges swapped"

    def describe(self) -> str:
        return self.label

    def attach(self, model: nn.Module, rows: slice) -> list[RemovableHandle]:
        layer = kan_layer(model, self.layer)
        edges = torch.as_tensor(list(self.curves), dtype=torch.long).reshape(-1, 2)
        _check_edges(layer, edges)
        functions = list(self.curves.values())

        def swap(x: torch.Tensor) -> torch.Tensor:
            q, p = (edges[:, i].to(x.device) for i in (0, 1))
            x_in = layer.edge_input(x).double()[..., p]  # [..., E]
            phi = (layer.basis_values(x_in) * layer.spline_coefficients(q, p)).sum(-1)
            new = torch.stack([f(x_in[..., e]).double() for e, f in enumerate(functions)], dim=-1)
            delta = x_in.new_zeros(*x_in.shape[:-1], layer.out_features)
            return delta.index_add_(-1, q, new - phi)

        return _edit_output(layer, rows, swap)


# ---------------------------------------------------------------------------------------------------- sweeps


def layer_importance(
    model: nn.Module, images: torch.Tensor, layers: Sequence[str], batch_size: int | None = None
) -> dict[str, EdgeImportance]:
    """pykan's edge importance (std of φ_{q,p}(x_p) over the images' tokens) of the named KAN layers."""
    stats = layer_statistics(model, images, layers=list(layers), batch_size=batch_size)
    return {name: edge_importance(kan_layer(model, name), stats[name]) for name in layers}


def prune_masks(importance: Mapping[str, EdgeImportance], threshold: float) -> dict[str, torch.Tensor]:
    """Per layer, the edges whose importance is below threshold x the layer's largest edge importance."""
    return {name: found.edge_std < threshold * found.edge_std.max() for name, found in importance.items()}


@dataclass
class PruneCurve:
    """Accuracy and label-logit change against the fraction of edges pruned, one point per threshold."""

    layers: list[str]
    thresholds: list[float]  # relative to each layer's largest edge importance
    edges_pruned: torch.Tensor  # [n]
    num_edges: int
    logit_change: torch.Tensor  # [n] mean change of the label-class logit
    logit_abs_change: torch.Tensor  # [n] mean absolute change
    accuracy_change: torch.Tensor  # [n] percentage points
    clean_accuracy: float
    clean_logit: float
    num_images: int

    @property
    def fraction_pruned(self) -> torch.Tensor:
        """[n] the share of the layers' edges pruned at each threshold."""
        return self.edges_pruned.double() / self.num_edges

    def to_dict(self) -> dict[str, Any]:
        return json_ready(self) | {"fraction_pruned": json_ready(self.fraction_pruned)}


def prune_sweep(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    thresholds: Sequence[float] = (0.0, 0.01, 0.03, 0.1, 0.3),
    layers: Sequence[str] | None = None,
    importance: Mapping[str, EdgeImportance] | None = None,
    batch_size: int | None = None,
) -> PruneCurve:
    """Prune every edge under each threshold (relative to its layer's most important edge) in the named KAN layers
    (default: all) together, and measure on the images; importance defaults to the images' own."""
    layers = list(kan_layers(model)) if layers is None else list(layers)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no KAN layers to prune")
    if importance is None:
        importance = layer_importance(model, images, layers, batch_size)
    ablations, pruned = [], []
    for threshold in thresholds:
        masks = prune_masks({name: importance[name] for name in layers}, threshold)
        ablations.append([EdgeAblation(name, mask, f"{name} below {threshold:g}") for name, mask in masks.items()])
        pruned.append(sum(int(mask.sum()) for mask in masks.values()))
    found = measure(model, images, labels, ablations, batch_size)
    return PruneCurve(
        layers=layers,
        thresholds=[float(t) for t in thresholds],
        edges_pruned=torch.tensor(pruned),
        num_edges=sum(importance[name].edge_std.numel() for name in layers),
        logit_change=found.logit_change,
        logit_abs_change=found.logit_abs_change,
        accuracy_change=found.accuracy_change,
        clean_accuracy=found.clean_accuracy,
        clean_logit=found.clean_logit,
        num_images=found.num_images,
    )


@dataclass
class SymbolicSwapResult:
    """A layer's top-k edges swapped for their symbolic fits, one at a time and all together: a fit is good when
    the swapped model agrees with the model (small logit change), not only when its R² is high."""

    layer: str
    edges: list[tuple[int, int]]  # most important first
    importance: list[float]  # edge std over the images' tokens
    formulas: list[str]
    r2: list[float]  # of each fit on its fitting grid
    edge_logit_change: torch.Tensor  # [k] that edge swapped alone
    edge_logit_abs_change: torch.Tensor  # [k]
    edge_accuracy_change: torch.Tensor  # [k]
    logit_change: float  # all k swapped together
    logit_abs_change: float
    accuracy_change: float
    clean_accuracy: float
    clean_logit: float
    num_images: int

    def to_dict(self) -> dict[str, Any]:
        return json_ready(self)


def symbolic_swap(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    layer: str,
    k: int = 5,
    fits: Mapping[tuple[int, int], SymbolicFit] | None = None,
    importance: EdgeImportance | None = None,
    library: Mapping[str, SymbolicFunction] | Sequence[str] | None = None,
    batch_size: int | None = None,
) -> SymbolicSwapResult:
    """Swap the layer's k most important edges for their symbolic fits (fitted with `fit_edge` unless given) on the
    images' real inputs; measure each alone and all together."""
    module = kan_layer(model, layer)
    if importance is None:
        importance = layer_importance(model, images, [layer], batch_size)[layer]
    top = importance.top_edges(k)
    edges = [(q, p) for q, p, _ in top]
    fits = dict(fits or {})
    for edge in edges:
        if edge not in fits:
            fits[edge] = fit_edge(module, edge, library=library).best
    singles = [EdgeSwap(layer, {edge: fits[edge]}, f"{layer} φ[{edge[0]},{edge[1]}] swapped") for edge in edges]
    together = EdgeSwap(layer, {edge: fits[edge] for edge in edges}, f"{layer} top {len(edges)} swapped")
    found = measure(model, images, labels, [*singles, together], batch_size)
    return SymbolicSwapResult(
        layer=layer,
        edges=edges,
        importance=[score for _, _, score in top],
        formulas=[fits[edge].formula() for edge in edges],
        r2=[fits[edge].r2 for edge in edges],
        edge_logit_change=found.logit_change[:-1],
        edge_logit_abs_change=found.logit_abs_change[:-1],
        edge_accuracy_change=found.accuracy_change[:-1],
        logit_change=float(found.logit_change[-1]),
        logit_abs_change=float(found.logit_abs_change[-1]),
        accuracy_change=float(found.accuracy_change[-1]),
        clean_accuracy=found.clean_accuracy,
        clean_logit=found.clean_logit,
        num_images=found.num_images,
    )
