"""Plotly figure builders: each takes analysis results (never a model) and returns a go.Figure.

Shared by `lkat-lens figures` and the Dash explorer, so a figure looks the same in a PNG and in the browser.
Non-finite values (an infinite gate half-life) are drawn as gaps (None).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from lkat_lens.analyses.attention import ClsAttention
from lkat_lens.analyses.attributions import Attribution
from lkat_lens.analyses.edge_functions import Coverage, EdgeCurves
from lkat_lens.analyses.gates import GateStats
from lkat_lens.analyses.tokens import TokenNorms

CURVE_COLOR = "#1f4e9c"
CENTER_COLOR = "#c0392b"
SHADE_COLOR = "rgba(120, 120, 120, 0.25)"
PANEL_PX = 220  # layout pixels per subplot side
TEMPLATE = "plotly_white"


def as_plot_values(values: torch.Tensor | np.ndarray) -> list:
    """Plot-ready nested lists of floats, with None where the input is not finite."""
    array = np.asarray(values.detach().cpu().double() if isinstance(values, torch.Tensor) else values, dtype=float)
    return np.where(np.isfinite(array), array, None).tolist()


def _grid_shape(n: int, cols: int) -> tuple[int, int]:
    """Rows and columns of a grid of n panels, at most `cols` wide."""
    cols = max(1, min(cols, n))
    return max(1, math.ceil(n / cols)), cols


def _shade(coverage: Coverage, low: float, high: float) -> go.Bar:
    """The layer's input histogram scaled to span [low, high], drawn as bars behind a curve."""
    counts = coverage.counts.double()
    edges = coverage.bin_edges.double()
    peak = float(counts.max()) if counts.numel() and float(counts.max()) > 0 else 1.0
    return go.Bar(
        x=((edges[:-1] + edges[1:]) / 2).tolist(),
        y=(counts / peak * (high - low)).tolist(),
        base=low,
        width=(edges[1:] - edges[:-1]).tolist(),
        marker={"color": SHADE_COLOR, "line": {"width": 0}},
        hoverinfo="skip",
        showlegend=False,
        name="input distribution",
    )


def _y_span(values: torch.Tensor) -> tuple[float, float]:
    """A padded [low, high] around the values (never empty)."""
    low, high = float(values.min()), float(values.max())
    pad = 0.08 * (high - low) if high > low else max(abs(high), 1.0) * 0.1
    return low - pad, high + pad


def edge_curve_figure(
    curves: EdgeCurves,
    coverage: Coverage | None = None,
    *,
    scores: Sequence[float] | None = None,
    title: str = "",
    cols: int = 4,
) -> go.Figure:
    """Grid of edge functions phi_{q,p}(x), one panel per edge: curve, grid centres, input distribution behind.

    Per panel the traces are, in order: the shaded distribution (when `coverage` is given), the curve
    (y = curves.values[e]) and the grid centres (markers on the panel's lower edge). Every x-axis spans
    curves.x, which by default is [grid_min - 2h, grid_max + 2h].
    """
    n = curves.edges.shape[0]
    rows, cols = _grid_shape(n, cols)
    labels = []
    for e, (q, p) in enumerate(curves.edges.tolist()):
        score = "" if scores is None else f"  σ={scores[e]:.3g}"
        labels.append(f"φ[{q},{p}]{score}")
    spacing = min(70 / (rows * PANEL_PX), 0.9 / max(rows - 1, 1))  # about 70 px between rows
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=labels, horizontal_spacing=0.04, vertical_spacing=spacing)
    x = curves.x.tolist()
    centers = curves.centers.tolist()
    for e in range(n):
        row, col = e // cols + 1, e % cols + 1
        low, high = _y_span(curves.values[e])
        if coverage is not None:
            fig.add_trace(_shade(coverage, low, high), row=row, col=col)
        fig.add_trace(
            go.Scatter(
                x=x,
                y=curves.values[e].tolist(),
                mode="lines",
                line={"color": CURVE_COLOR, "width": 2},
                name=labels[e],
                showlegend=False,
            ),
            row=row,
            col=col,
        )
        fig.add_trace(
            go.Scatter(
                x=centers,
                y=[low] * len(centers),
                mode="markers",
                name="grid centres",
                showlegend=False,
                marker={"symbol": "triangle-up", "size": 8, "color": CENTER_COLOR},
            ),
            row=row,
            col=col,
        )
        fig.update_yaxes(range=[low, high], row=row, col=col)
    fig.update_xaxes(range=[x[0], x[-1]])
    fig.update_layout(
        title=title or f"edge functions ({curves.basis} basis)",
        template=TEMPLATE,
        barmode="overlay",
        bargap=0,
        width=cols * PANEL_PX + 80,
        height=rows * PANEL_PX + 120,
        margin={"l": 40, "r": 20, "t": 90, "b": 40},
        font={"size": 10},
    )
    fig.update_annotations(font_size=10)
    return fig


def edge_overview_figure(curves_by_block: Mapping[int, Mapping[str, EdgeCurves]], title: str = "") -> go.Figure:
    """All blocks at a glance: one row per block, one column per KAN layer, each panel overlaying its curves."""
    blocks = list(curves_by_block)
    layers = sorted({name for per_block in curves_by_block.values() for name in per_block})
    titles = [f"block {b} {name}" for b in blocks for name in layers]
    fig = make_subplots(rows=len(blocks), cols=len(layers), subplot_titles=titles, vertical_spacing=0.25 / len(blocks))
    for r, block in enumerate(blocks, start=1):
        for c, name in enumerate(layers, start=1):
            curves = curves_by_block[block].get(name)
            if curves is None:
                continue
            x = curves.x.tolist()
            for e, (q, p) in enumerate(curves.edges.tolist()):
                fig.add_trace(
                    go.Scatter(
                        x=x,
                        y=curves.values[e].tolist(),
                        mode="lines",
                        name=f"{name} φ[{q},{p}]",
                        line={"width": 1},
                        opacity=0.8,
                        showlegend=False,
                    ),
                    row=r,
                    col=c,
                )
            fig.update_xaxes(range=[x[0], x[-1]], row=r, col=c)
    fig.update_layout(
        title=title or "most important edge functions per block",
        template=TEMPLATE,
        width=len(layers) * 360 + 80,
        height=len(blocks) * 200 + 120,
        margin={"l": 40, "r": 20, "t": 90, "b": 40},
        font={"size": 10},
    )
    fig.update_annotations(font_size=10)
    return fig


def gate_half_life_figure(gates: GateStats, title: str = "") -> go.Figure:
    """Forget-gate half-life (tokens) over the patch grid: one heatmap per GLA block (row) and head (column)."""
    maps = gates.half_life_map  # [L, H, gh, gw]
    n_blocks, n_heads = maps.shape[:2]
    titles = [f"block {b} head {h}" for b in gates.blocks for h in range(n_heads)]
    fig = make_subplots(
        rows=n_blocks, cols=n_heads, subplot_titles=titles, horizontal_spacing=0.02, vertical_spacing=0.3 / n_blocks
    )
    for i in range(n_blocks):
        for h in range(n_heads):
            fig.add_trace(
                go.Heatmap(z=as_plot_values(maps[i, h]), coloraxis="coloraxis", name=titles[i * n_heads + h]),
                row=i + 1,
                col=h + 1,
            )
    fig.update_yaxes(autorange="reversed", showticklabels=False, scaleanchor=None)
    fig.update_xaxes(showticklabels=False)
    fig.update_layout(
        title=title or "GLA forget-gate half-life per patch (tokens; blank = no decay)",
        template=TEMPLATE,
        coloraxis={"colorscale": "Viridis", "colorbar": {"title": "tokens"}},
        width=n_heads * 150 + 160,
        height=n_blocks * 150 + 120,
        margin={"l": 30, "r": 30, "t": 90, "b": 30},
        font={"size": 10},
    )
    fig.update_annotations(font_size=9)
    return fig


def gate_head_figure(gates: GateStats, title: str = "") -> go.Figure:
    """Half-life per block and head (log gate averaged over key channels), one heatmap per token group."""
    groups = gates.head_half_life_by_type
    fig = make_subplots(rows=1, cols=len(groups), subplot_titles=list(groups), horizontal_spacing=0.04)
    for c, (name, values) in enumerate(groups.items(), start=1):
        fig.add_trace(
            go.Heatmap(z=as_plot_values(values), y=gates.blocks, coloraxis="coloraxis", name=name),
            row=1,
            col=c,
        )
        fig.update_xaxes(title_text="head", row=1, col=c)
    fig.update_yaxes(title_text="block", autorange="reversed", row=1, col=1)
    fig.update_layout(
        title=title or "GLA forget-gate half-life per block and head, by token type (tokens)",
        template=TEMPLATE,
        coloraxis={"colorscale": "Viridis", "colorbar": {"title": "tokens"}},
        width=len(groups) * 200 + 160,
        height=420,
        font={"size": 10},
    )
    return fig


def token_norm_figure(norms: TokenNorms, title: str = "") -> go.Figure:
    """Mean residual-stream norm of each token group across depth, with the patch median and outlier cut."""
    depth = list(range(norms.norms.shape[0]))
    fig = go.Figure()
    for name, values in norms.group_norms().items():
        fig.add_trace(go.Scatter(x=depth, y=values.double().mean((1, 2)).tolist(), mode="lines+markers", name=name))
    fig.add_trace(
        go.Scatter(
            x=depth,
            y=norms.patches.flatten(1).median(-1).values.tolist(),
            mode="lines",
            line={"dash": "dot", "color": "gray"},
            name="patch median",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=depth,
            y=norms.thresholds.tolist(),
            mode="lines",
            line={"dash": "dash", "color": "black"},
            name="outlier threshold",
        )
    )
    fig.update_layout(
        title=title or "token norms across depth (0 = embedding, d = after block d-1)",
        template=TEMPLATE,
        xaxis_title="depth",
        yaxis_title="L2 norm",
        width=760,
        height=440,
    )
    return fig


def _overlay_axes(image_hw: tuple[int, int]) -> dict:
    """Axis settings that show an image pixel-exact with row 0 at the top."""
    h, w = image_hw
    return {
        "x": {"range": [-0.5, w - 0.5], "showticklabels": False, "showgrid": False, "zeroline": False},
        "y": {"range": [h - 0.5, -0.5], "showticklabels": False, "showgrid": False, "zeroline": False},
    }


def _heat_on_image(values: torch.Tensor, cell: tuple[int, int], **style) -> go.Heatmap:
    """A [rows, cols] map whose cells cover cell = (ph, pw) image pixels each."""
    return go.Heatmap(
        z=as_plot_values(values), x0=(cell[1] - 1) / 2, dx=cell[1], y0=(cell[0] - 1) / 2, dy=cell[0], **style
    )


def _image_grid(rows: int, cols: int, titles: Sequence[str]) -> go.Figure:
    """A rows x cols subplot grid for images."""
    return make_subplots(
        rows=rows, cols=cols, subplot_titles=list(titles), horizontal_spacing=0.02, vertical_spacing=0.3 / rows
    )


def _finish_image_grid(fig: go.Figure, image_hw: tuple[int, int], rows: int, cols: int, title: str) -> go.Figure:
    """Pixel-exact axes, square panels and the layout size of an image grid."""
    axes = _overlay_axes(image_hw)
    fig.update_xaxes(**axes["x"])
    fig.update_yaxes(**axes["y"])
    fig.update_layout(
        title=title,
        template=TEMPLATE,
        width=cols * 170 + 160,
        height=rows * 170 + 110,
        margin={"l": 30, "r": 30, "t": 90, "b": 20},
        font={"size": 10},
    )
    fig.update_annotations(font_size=10)
    return fig


def cls_attention_figure(
    attention: ClsAttention, images: np.ndarray, *, patch_size: tuple[int, int], title: str = ""
) -> go.Figure:
    """Class-token attention on the patches (head mean) overlaid on each image, one row per block under the images.

    `images` are display images [B, H, W, 3] uint8. Traces per image: the image, then per block the image and a
    heatmap with z = patch_maps[block, image].mean(heads).
    """
    maps = attention.patch_maps.double().mean(2)  # [L, B, gh, gw]
    n_images = images.shape[0]
    rows = 1 + len(attention.blocks)
    titles = [f"image {b}" for b in range(n_images)]
    titles += [
        f"block {blk} ({kind})" if b == 0 else ""
        for blk, kind in zip(attention.blocks, attention.kinds, strict=True)
        for b in range(n_images)
    ]
    fig = _image_grid(rows, n_images, titles)
    for b in range(n_images):
        fig.add_trace(go.Image(z=images[b], name=f"image {b}"), row=1, col=b + 1)
        for r in range(len(attention.blocks)):
            fig.add_trace(go.Image(z=images[b], opacity=0.6, name=f"image {b}"), row=r + 2, col=b + 1)
            fig.add_trace(
                _heat_on_image(
                    maps[r, b], patch_size, coloraxis="coloraxis", opacity=0.7, name=f"block {attention.blocks[r]}"
                ),
                row=r + 2,
                col=b + 1,
            )
    fig.update_layout(coloraxis={"colorscale": "RdBu", "cmid": 0, "colorbar": {"title": "weight"}})
    return _finish_image_grid(
        fig, images.shape[1:3], rows, n_images, title or "class-token attention on the patches (head mean)"
    )


def attribution_figure(attribution: Attribution, images: np.ndarray, title: str = "") -> go.Figure:
    """Each image (top) and its pixel attribution map overlaid on it (bottom, z = attribution.pixel_map[b])."""
    pixels = attribution.pixel_map.double()
    n_images = images.shape[0]
    limit = float(pixels.abs().max()) or 1.0
    targets = attribution.target.tolist()
    titles = [f"image {b} (class {targets[b]})" for b in range(n_images)] + [attribution.method] * n_images
    fig = _image_grid(2, n_images, titles)
    for b in range(n_images):
        fig.add_trace(go.Image(z=images[b], name=f"image {b}"), row=1, col=b + 1)
        fig.add_trace(go.Image(z=images[b], opacity=0.6, name=f"image {b}"), row=2, col=b + 1)
        fig.add_trace(
            _heat_on_image(pixels[b], (1, 1), coloraxis="coloraxis", opacity=0.65, name=f"attribution {b}"),
            row=2,
            col=b + 1,
        )
    fig.update_layout(
        coloraxis={"colorscale": "RdBu", "cmin": -limit, "cmax": limit, "colorbar": {"title": "attribution"}}
    )
    return _finish_image_grid(
        fig, images.shape[1:3], 2, n_images, title or f"{attribution.method} attributions of the predicted class"
    )
