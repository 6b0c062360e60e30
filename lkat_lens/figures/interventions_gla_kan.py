"""Figures of the GLA and KAN interventions: gate clamps per [block × head], state cuts per [block × position], the
KAN prune curve and the symbolic-swap table; and one block's residual patching map drawn over the image (the
explorer's Interventions tab; figures/interventions.py draws every block's)."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from lkat_lens.analyses.interventions.edges import PruneCurve, SymbolicSwapResult
from lkat_lens.analyses.interventions.gates import GateClampSweep, StateCutSweep
from lkat_lens.analyses.interventions.patching import PatchingResult

from . import TEMPLATE, as_plot_values, patch_map_figure

SIGNED = {"colorscale": "RdBu", "zmid": 0}


def gate_clamp_figure(sweep: GateClampSweep, title: str = "") -> go.Figure:
    """Change of the label-class logit per [block × head] (and all heads of the block, right column), one panel
    per clamped α."""
    heads = sweep.head_logit_change.shape[-1]
    columns = [str(h) for h in range(heads)] + ["all"]
    fig = make_subplots(rows=1, cols=len(sweep.alphas), subplot_titles=[f"α clamped to {a:g}" for a in sweep.alphas])
    for i, alpha in enumerate(sweep.alphas):
        values = torch.cat([sweep.head_logit_change[i], sweep.block_logit_change[i, :, None]], dim=-1)
        accuracy = torch.cat([sweep.head_accuracy_change[i], sweep.block_accuracy_change[i, :, None]], dim=-1)
        fig.add_trace(
            go.Heatmap(
                z=as_plot_values(values),
                x=columns,
                y=[str(b) for b in sweep.blocks],
                customdata=as_plot_values(accuracy),
                hovertemplate="block %{y} head %{x}<br>Δ logit %{z:.3f}<br>Δ accuracy %{customdata:.1f} pp"
                "<extra></extra>",
                coloraxis="coloraxis",
                name=f"α={alpha:g}",
            ),
            row=1,
            col=i + 1,
        )
        fig.update_xaxes(title_text="head", row=1, col=i + 1)
    fig.update_yaxes(title_text="block", autorange="reversed")
    fig.update_layout(
        title=title or f"GLA gate clamps: change of the label logit (clean accuracy {sweep.clean_accuracy:.1f} %)",
        template=TEMPLATE,
        coloraxis={"colorbar": {"title": "Δ logit"}, "colorscale": "RdBu", "cmid": 0},
        width=len(sweep.alphas) * (40 * (heads + 1) + 120) + 160,
        height=max(300, 30 * len(sweep.blocks) + 160),
    )
    return fig


def state_cut_figure(sweep: StateCutSweep, title: str = "") -> go.Figure:
    """Change of the label-class logit per [block × position] when the state is cut before that token."""
    fig = go.Figure(
        go.Heatmap(
            z=as_plot_values(sweep.logit_change),
            x=sweep.position_names,
            y=[str(b) for b in sweep.blocks],
            customdata=as_plot_values(sweep.accuracy_change),
            hovertemplate="block %{y}, cut before %{x}<br>Δ logit %{z:.3f}<br>Δ accuracy %{customdata:.1f} pp"
            "<extra></extra>",
            colorbar={"title": "Δ logit"},
            **SIGNED,
        )
    )
    fig.update_yaxes(title_text="block", autorange="reversed")
    fig.update_xaxes(title_text="state cut before token")
    fig.update_layout(
        title=title or "GLA state cuts: change of the label logit", template=TEMPLATE, width=900, height=420
    )
    return fig


def prune_curve_figure(curve: PruneCurve, title: str = "") -> go.Figure:
    """Accuracy change and label-logit change against the fraction of KAN edges pruned."""
    fraction = as_plot_values(curve.fraction_pruned)
    text = [f"threshold {t:g}" for t in curve.thresholds]
    fig = make_subplots(rows=1, cols=2, subplot_titles=["accuracy change (pp)", "label-logit change"])
    fig.add_trace(go.Scatter(x=fraction, y=as_plot_values(curve.accuracy_change), text=text, name="Δ accuracy"), 1, 1)
    fig.add_trace(go.Scatter(x=fraction, y=as_plot_values(curve.logit_change), text=text, name="Δ logit"), 1, 2)
    fig.add_trace(
        go.Scatter(x=fraction, y=as_plot_values(curve.logit_abs_change), text=text, name="mean |Δ logit|"), 1, 2
    )
    fig.update_xaxes(title_text="fraction of edges pruned", range=[0, 1])
    fig.update_layout(
        title=title
        or f"KAN pruning ({len(curve.layers)} layers, {curve.num_edges:,} edges, {curve.num_images} images)",
        template=TEMPLATE,
        width=900,
        height=380,
    )
    return fig


def symbolic_swap_figure(result: SymbolicSwapResult, title: str = "") -> go.Figure:
    """The swap table: each top edge's formula and R², and the logit and accuracy change with it swapped alone;
    the last row swaps them all."""
    edges = [f"φ[{q},{p}]" for q, p in result.edges] + ["all together"]
    columns = {
        "edge": edges,
        "importance": [f"{v:.3g}" for v in result.importance] + [""],
        "formula": result.formulas + [""],
        "R²": [f"{v:.4f}" for v in result.r2] + [""],
        "Δ logit": [f"{v:+.4f}" for v in result.edge_logit_change.tolist()] + [f"{result.logit_change:+.4f}"],
        "mean |Δ logit|": [f"{v:.4f}" for v in result.edge_logit_abs_change.tolist()]
        + [f"{result.logit_abs_change:.4f}"],
        "Δ accuracy (pp)": [f"{v:+.1f}" for v in result.edge_accuracy_change.tolist()]
        + [f"{result.accuracy_change:+.1f}"],
    }
    fig = go.Figure(
        go.Table(
            header={"values": list(columns), "align": "left"},
            cells={"values": list(columns.values()), "align": "left"},
            columnwidth=[1, 1, 3, 1, 1, 1, 1],
        )
    )
    fig.update_layout(
        title=title or f"{result.layer}: top edges swapped for their symbolic fits ({result.num_images} images)",
        template=TEMPLATE,
        width=900,
        height=120 + 30 * len(edges),
        margin={"t": 60, "b": 10},
    )
    return fig


def patching_grid_figure(
    result: PatchingResult, block: int, image: np.ndarray, patch_size: tuple[int, int], title: str = ""
) -> go.Figure:
    """One block's row of a [block × position] patching result over the patch grid of the image."""
    if result.grid is None or "patches" not in result.layout:
        raise ValueError(f"patching along {result.axes[1]!r} has no patch grid to draw on")
    row = result.values[result.blocks.index(block)]
    where = {u: i for i, u in enumerate(result.units)}
    values = torch.tensor([row[where[p]].item() if p in where else math.nan for p in result.layout["patches"]])
    return patch_map_figure(
        values.view(*result.grid),
        image,
        patch_size=patch_size,
        signed=True,
        colorbar="restored",
        title=title or f"block {block}: patching {result.point} per patch (1 = restores the clean logit)",
    )
