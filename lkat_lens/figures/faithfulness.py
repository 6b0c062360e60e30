"""Figures of the map evaluation (analyses.faithfulness): the methods x metrics table, the MPRT and perturbation
curves, and an object mask's outline to lay over an image."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from lkat_lens.analyses.faithfulness import HIGHER_IS_BETTER, METRICS, MethodEvaluation

TEMPLATE = "plotly_white"
MASK_COLOR = "#00c853"
METRIC_LABELS = {
    "pointing_game": "pointing game ↑",
    "relevance_mass": "relevance mass ↑",
    "relevance_rank": "rank accuracy ↑",
    "pixel_accuracy": "pixel acc. ↑",
    "miou": "mIoU ↑",
    "average_precision": "mAP ↑",
    "positive_auc": "positive AUC ↓",
    "negative_auc": "negative AUC ↑",
    "deletion_auc": "deletion AUC ↓",
    "insertion_auc": "insertion AUC ↑",
    "mprt": "MPRT ρ ↓",
}


def column_quality(table: Mapping[str, Mapping[str, float]], metric: str) -> list[float | None]:
    """Each method's value of one metric scaled to [0, 1] within the column, 1 the best (None where undefined)."""
    values = [table[m].get(metric, math.nan) for m in table]
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return [None] * len(values)
    low, high = min(finite), max(finite)
    span = (high - low) or 1.0
    scaled = [(v - low) / span if math.isfinite(v) else None for v in values]
    return [s if s is None or HIGHER_IS_BETTER[metric] else 1 - s for s in scaled]


def evaluation_table_figure(table: Mapping[str, Mapping[str, float]], title: str = "") -> go.Figure:
    """Methods (rows) x metrics (columns), each cell its value; the colour ranks the methods within a column
    (green: best of the methods, the arrows say which way is better)."""
    methods = list(table)
    metrics = [m for m in METRICS if any(m in row for row in table.values())]
    quality = np.array([column_quality(table, m) for m in metrics], dtype=float).T  # [methods, metrics]
    text = [[_fmt(table[method].get(metric, math.nan)) for metric in metrics] for method in methods]
    fig = go.Figure(
        go.Heatmap(
            z=np.where(np.isfinite(quality), quality, None).tolist(),
            x=[METRIC_LABELS[m] for m in metrics],
            y=methods,
            text=text,
            texttemplate="%{text}",
            colorscale="RdYlGn",
            zmin=0,
            zmax=1,
            showscale=False,
            hovertemplate="%{y}<br>%{x}: %{text}<extra></extra>",
        )
    )
    fig.update_layout(
        title=title or "Are the maps right? Faithfulness and localisation against the object masks",
        template=TEMPLATE,
        yaxis={"autorange": "reversed"},
        xaxis={"side": "top", "tickangle": -30},
        width=160 + 92 * len(metrics),
        height=170 + 34 * len(methods),
        margin={"l": 140, "r": 20, "t": 150, "b": 20},
        font={"size": 11},
    )
    return fig


def _fmt(value: float) -> str:
    return "—" if not math.isfinite(value) else f"{value:.3f}"


def mprt_figure(results: Mapping[str, MethodEvaluation], title: str = "") -> go.Figure:
    """Mean Spearman correlation of each method's maps with the trained model's, as blocks are randomised from
    the top one down (a map that ignores the weights stays at 1)."""
    fig = go.Figure()
    for method, result in results.items():
        if not result.mprt.numel():
            continue
        depth = list(range(1, len(result.mprt_blocks) + 1))
        mean = result.mprt.double().nanmean(1)
        labels = [f"blocks {result.mprt_blocks[0]}..{b}" for b in result.mprt_blocks]
        fig.add_trace(
            go.Scatter(
                x=depth,
                y=mean.tolist(),
                mode="lines+markers",
                name=method,
                text=labels,
                hovertemplate="%{text} randomised: ρ = %{y:.3f}<extra>" + method + "</extra>",
            )
        )
    fig.update_layout(
        title=title or "MPRT: rank correlation with the trained model's maps as blocks are randomised (top first)",
        template=TEMPLATE,
        xaxis={"title": "blocks randomised, from the top", "dtick": 1},
        yaxis={"title": "Spearman ρ of |map|", "range": [-0.2, 1.05]},
        width=760,
        height=440,
    )
    return fig


def perturbation_figure(results: Mapping[str, MethodEvaluation], title: str = "") -> go.Figure:
    """Mean target-class probability as patches are removed most-relevant first (positive perturbation, left:
    low is faithful) and least-relevant first (negative, right: high is faithful)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["positive perturbation ↓", "negative perturbation ↑"])
    palette = [f"hsl({int(360 * i / max(len(results), 1))}, 65%, 45%)" for i in range(len(results))]
    for color, (method, result) in zip(palette, results.items(), strict=True):
        x = result.fractions["perturbation"]
        for col, (kind, fractions) in enumerate((("positive", x), ("negative", 1 - x.flip(0))), start=1):
            curve = result.curves[kind].double().mean(0)
            auc = result.summary()[f"{kind}_auc"]
            fig.add_trace(
                go.Scatter(
                    x=fractions.tolist(),
                    y=curve.tolist(),
                    mode="lines",
                    line={"color": color},
                    name=method,
                    legendgroup=method,
                    showlegend=col == 1,
                    hovertemplate=f"{method} (AUC {auc:.3f})<br>%{{x:.0%}} removed: %{{y:.3f}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text="fraction of patches removed", range=[0, 1])
    fig.update_yaxes(range=[0, 1.02])
    fig.update_yaxes(title_text="target-class probability", col=1)
    fig.update_layout(
        title=title or "Positive / negative perturbation (patches replaced by the mean image)",
        template=TEMPLATE,
        width=980,
        height=max(440, 160 + 26 * len(results)),
    )
    return fig


def evaluation_figures(results: Mapping[str, MethodEvaluation]) -> dict[str, go.Figure]:
    """Every figure of an evaluation by file name: the table, the perturbation and the MPRT curves."""
    table = {method: result.summary() for method, result in results.items()}
    figs = {"evaluation_table": evaluation_table_figure(table), "evaluation_perturbation": perturbation_figure(results)}
    if any(r.mprt.numel() for r in results.values()):
        figs["evaluation_mprt"] = mprt_figure(results)
    return figs


def mask_outline(mask: torch.Tensor | np.ndarray, name: str = "object mask") -> go.Contour:
    """The outline of a bool mask [H, W] in image pixel coordinates, to add over an image."""
    z = np.asarray(mask.cpu() if isinstance(mask, torch.Tensor) else mask, dtype=float)
    return go.Contour(
        z=z.tolist(),
        contours={"start": 0.5, "end": 0.5, "size": 1, "coloring": "none"},
        line={"color": MASK_COLOR, "width": 2},
        showscale=False,
        hoverinfo="skip",
        name=name,
    )
