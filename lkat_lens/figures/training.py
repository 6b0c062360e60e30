"""Figures of a run's telemetry over epochs: one figure per quantity, one line per block (and layer, head or
token type), built from the parsed telemetry.jsonl records (`telemetry_records.read_telemetry`), never a model.
Click a legend entry to hide a line, double-click to show it alone."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from . import TEMPLATE

Record = Mapping[str, Any]
Extractor = Callable[[Mapping[str, Any]], Mapping[str, float | None]]


def _kan(field: str) -> Extractor:
    return lambda entry: {layer: kan[field] for layer, kan in entry.get("kan", {}).items()}


def _median_half_life(entry: Mapping[str, Any]) -> dict[str, float | None]:
    gates = entry.get("gates")
    if gates is None:
        return {}
    middle = gates["quantile_levels"].index(0.5)
    return {f"head {h}": q[middle] for h, q in enumerate(gates["half_life_quantiles"])}


def _patch_half_life(entry: Mapping[str, Any]) -> dict[str, float | None]:
    gates = entry.get("gates")
    return {} if gates is None else {f"head {h}": v for h, v in enumerate(gates["half_life_by_type"]["patches"])}


# name -> (title, y-axis title, log y, extractor: a record's block entry -> {line label: value})
QUANTITIES: dict[str, tuple[str, str, bool, Extractor]] = {
    "kan_output_residual_ratio": (
        "KAN output norm / residual norm (dormant below 1e-3)",
        "ratio",
        True,
        _kan("output_residual_ratio"),
    ),
    "kan_outside_fraction": ("Share of KAN inputs outside the grid support", "share", False, _kan("outside_fraction")),
    "kan_grid_span_share": ("Share of the grid span the KAN inputs occupy", "share", False, _kan("grid_span_share")),
    "gate_half_life_median": ("Median forget-gate half-life per head", "tokens", True, _median_half_life),
    "gate_half_life_patches": ("Forget-gate half-life of patch tokens per head", "tokens", True, _patch_half_life),
    "resid_norm": (
        "Residual norm after the block by token type",
        "mean L2 norm",
        False,
        lambda e: e.get("resid_norm", {}),
    ),
    "outlier_patches": (
        "High-norm outlier patches after the block",
        "patches",
        False,
        lambda e: {"outliers": e["outlier_patches"]} if "outlier_patches" in e else {},
    ),
    "weight_norm": ("Weight norm per block", "L2 norm", False, lambda e: {"weights": e["weight_norm"]}),
    "grad_norm": ("Gradient norm per block (last step)", "L2 norm", True, lambda e: {"gradients": e["grad_norm"]}),
}


def epoch_records(records: Iterable[Record]) -> list[Record]:
    """The end-of-epoch records, in epoch order."""
    return sorted((r for r in records if r.get("kind") == "epoch"), key=lambda r: r["epoch"])


def block_series(
    records: Sequence[Record], extract: Extractor, blocks: Collection[int] | None = None
) -> dict[str, tuple[list[int], list[float | None]]]:
    """Line label ("block B · label") -> (epochs, values) of one quantity over the records (chosen blocks only)."""
    series: dict[str, tuple[list[int], list[float | None]]] = {}
    for record in records:
        for entry in record["blocks"]:
            if blocks is not None and entry["block"] not in blocks:
                continue
            for label, value in extract(entry).items():
                epochs, values = series.setdefault(f"block {entry['block']} · {label}", ([], []))
                epochs.append(record["epoch"])
                values.append(value)
    return series


def telemetry_figure(records: Sequence[Record], name: str, blocks: Collection[int] | None = None) -> go.Figure:
    """The figure of one quantity (a key of QUANTITIES) over the epoch records, for the chosen blocks (all)."""
    title, y_title, log_y, extract = QUANTITIES[name]
    fig = go.Figure()
    for label, (epochs, values) in block_series(epoch_records(records), extract, blocks).items():
        fig.add_trace(
            go.Scatter(x=epochs, y=values, mode="lines+markers", name=label, legendgroup=label.split(" ·")[0])
        )
    fig.update_layout(
        title=title,
        template=TEMPLATE,
        xaxis={"title": "epoch", "tickformat": "d"},
        yaxis_title=y_title,
        yaxis_type="log" if log_y else "linear",
        legend={"groupclick": "toggleitem"},
        height=420,
    )
    return fig


def telemetry_figures(records: Sequence[Record]) -> dict[str, go.Figure]:
    """Every telemetry figure with data in `records`, by quantity name (see QUANTITIES)."""
    epochs = epoch_records(records)
    figures = {}
    for name, (_, _, _, extract) in QUANTITIES.items():
        if epochs and any(extract(entry) for entry in epochs[0]["blocks"]):
            figures[name] = telemetry_figure(epochs, name)
    return figures
