"""Figures of the interventions (analyses/interventions): activation-patching maps ([block x position] on the patch
grid, [block x head], [block x channel]), ablations with their controls, direct logit attribution, the logit lens."""

from __future__ import annotations

import math

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from lkat_lens.analyses.interventions import AblationResult, DirectLogitAttribution, LogitLens, PatchingResult

from . import TEMPLATE, as_plot_values

PATCH_SCALE = "RdBu"  # diverging around 0 (corrupted); 1 = clean restored
PANEL = 150  # pixels per patch-grid panel


def _title(result: PatchingResult) -> str:
    return (
        f"activation patching, {result.point} ({result.metric}: clean {result.clean_metric:.3g}, "
        f"corrupted {result.corrupt_metric:.3g}; 0 = corrupted, 1 = clean)"
    )


def patching_figure(result: PatchingResult, title: str = "") -> go.Figure:
    """A patching result: per block, the patch positions on the patch grid (panel titles give the class token and
    the largest register value) for axes (block, position); otherwise one heatmap [block x unit]."""
    if result.axes[1] != "position" or result.grid is None:
        return unit_heatmap(result.values, result.blocks, result.units, result.axes[1], title or _title(result))
    gh, gw = result.grid
    position = {u: i for i, u in enumerate(result.units)}
    patches = result.layout.get("patches", [])
    if len(patches) != gh * gw or any(p not in position for p in patches):
        return unit_heatmap(result.values, result.blocks, result.units, "position", title or _title(result))
    cols = min(len(result.blocks), 6)
    rows = math.ceil(len(result.blocks) / cols)
    titles = [_panel_title(result, i, b, position) for i, b in enumerate(result.blocks)]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.02, vertical_spacing=0.12)
    for i, _ in enumerate(result.blocks):
        grid = result.values[i, [position[p] for p in patches]].reshape(gh, gw)
        fig.add_trace(go.Heatmap(z=as_plot_values(grid), coloraxis="coloraxis"), row=i // cols + 1, col=i % cols + 1)
    fig.update_yaxes(autorange="reversed", showticklabels=False, showgrid=False, zeroline=False)
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    for i in range(len(result.blocks)):
        fig.layout[f"yaxis{i + 1 if i else ''}"].update(scaleanchor=f"x{i + 1 if i else ''}", constrain="domain")
    fig.update_layout(
        title=title or _title(result),
        template=TEMPLATE,
        coloraxis={"colorscale": PATCH_SCALE, "cmid": 0, "colorbar": {"title": "restored"}},
        width=cols * PANEL + 160,
        height=rows * (PANEL + 30) + 120,
        margin={"l": 30, "r": 30, "t": 90, "b": 30},
        font={"size": 10},
    )
    fig.update_annotations(font_size=9)
    return fig


def _panel_title(result: PatchingResult, row: int, block: int, position: dict[int, int]) -> str:
    parts = [f"block {block}"]
    for kind in ("cls", "registers"):
        values = [result.values[row, position[p]].item() for p in result.layout.get(kind, []) if p in position]
        if values:
            parts.append(f"{'cls' if kind == 'cls' else 'reg max'} {max(values):.2f}")
    return " · ".join(parts)


def unit_heatmap(values: torch.Tensor, blocks: list[int], units: list[int], axis: str, title: str) -> go.Figure:
    """A [block x unit] heatmap (heads, channels or positions) around 0."""
    fig = go.Figure(
        go.Heatmap(
            z=as_plot_values(values),
            x=[str(u) for u in units],
            y=[f"block {b}" for b in blocks],
            colorscale=PATCH_SCALE,
            zmid=0,
            hovertemplate=f"%{{y}}, {axis} %{{x}}: %{{z:.3f}}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(
        title=title,
        template=TEMPLATE,
        xaxis_title=axis,
        width=min(1400, 300 + 18 * len(units)),
        height=160 + 28 * len(blocks),
        font={"size": 10},
    )
    return fig


def ablation_figure(result: AblationResult, title: str = "") -> go.Figure:
    """The metric's change under each ablation (one panel per method, one colour scale): [block x unit]."""
    fig = make_subplots(rows=1, cols=len(result.methods), subplot_titles=list(result.methods), shared_yaxes=True)
    for i, _ in enumerate(result.methods):
        fig.add_trace(
            go.Heatmap(
                z=as_plot_values(result.effect[i]),
                x=[str(u) for u in result.units],
                y=[f"block {b}" for b in result.blocks],
                coloraxis="coloraxis",
            ),
            row=1,
            col=i + 1,
        )
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(
        title=title or f"ablations of {result.point}: change of {result.metric} (clean {result.clean_metric:.3g})",
        template=TEMPLATE,
        coloraxis={"colorscale": PATCH_SCALE, "cmid": 0, "colorbar": {"title": "change"}},
        width=min(1600, 200 + len(result.methods) * max(160, 14 * len(result.units))),
        height=180 + 28 * len(result.blocks),
        font={"size": 10},
    )
    return fig


def dla_figure(dla: DirectLogitAttribution, image: int = 0, title: str = "") -> go.Figure:
    """Each component's direct contribution to the target logit of one image, the biases, and their sum."""
    totals = dla.totals[image]
    bias = float(dla.bias[image] @ dla.readout)
    names = [*dla.components, "biases"]
    values = [*totals.tolist(), bias]
    fig = go.Figure(
        go.Bar(
            x=names,
            y=values,
            marker_color=["#1f4e9c" if v >= 0 else "#c0392b" for v in values],
            hovertemplate="%{x}: %{y:.4f}<extra></extra>",
        )
    )
    target = int(dla.target[image])
    fig.update_layout(
        title=title
        or f"direct logit attribution, class {target}: sum {float(dla.logit[image]):.4f} "
        f"(model {float(dla.model_logit[image]):.4f})",
        template=TEMPLATE,
        yaxis_title="logit contribution",
        width=max(500, 40 * len(names) + 160),
        height=420,
        font={"size": 10},
    )
    return fig


def logit_lens_figure(lens: LogitLens, image: int = 0, classes: int = 5, title: str = "") -> go.Figure:
    """The logits of the final top classes (and the target) after the embedding and each block, for one image."""
    logits = lens.logits[image]  # [layer, class]
    target = int(lens.target[image])
    shown = list(dict.fromkeys([target, *logits[-1].topk(min(classes, logits.shape[-1])).indices.tolist()]))
    fig = go.Figure()
    for c in shown:
        fig.add_trace(
            go.Scatter(
                x=lens.layers,
                y=as_plot_values(logits[:, c]),
                mode="lines+markers",
                name=f"class {c}" + (" (target)" if c == target else ""),
                line={"width": 3 if c == target else 1.5},
            )
        )
    fig.update_layout(
        title=title or "logit lens: the head through the final norm after each block",
        template=TEMPLATE,
        yaxis_title="logit",
        width=max(520, 60 * len(lens.layers) + 200),
        height=420,
        font={"size": 10},
    )
    return fig
