"""Plotly figure builders: each takes analysis results (never a model) and returns a go.Figure.

Shared by `lkat-lens figures` and the Dash explorer, so a figure looks the same in a PNG and in the browser.
Non-finite values (an infinite gate half-life) are drawn as gaps (None).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from lkat_lens.analyses.attention import ClsAttention
from lkat_lens.analyses.attributions import IG_TOLERANCE, Attribution, FaithfulnessCurves
from lkat_lens.analyses.edge_functions import Coverage, EdgeCurves, LayerStatistics
from lkat_lens.analyses.gates import GateStats
from lkat_lens.analyses.grid_span import is_sliver
from lkat_lens.analyses.probes import ProbeResults
from lkat_lens.analyses.symbolic import SymbolicFitResult
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


def span_note(share: float, explain: bool = False) -> str:
    """The share of the grid the inputs occupy (analyses.grid_span), flagged when they sit in a sliver of it
    (`explain`: and what that means for the curves)."""
    flag = (" ⚠ a sliver" + (": each curve is only read there" if explain else "")) if is_sliver(share) else ""
    return f"inputs (1–99 % per channel) occupy {share:.0%} of the grid{flag}"


def _y_span(values: torch.Tensor) -> tuple[float, float]:
    """A padded [low, high] around the values (never empty)."""
    low, high = float(values.min()), float(values.max())
    pad = 0.08 * (high - low) if high > low else max(abs(high), 1.0) * 0.1
    return low - pad, high + pad


def edge_layer_figure(
    block: int,
    layer: str,
    curves: EdgeCurves,
    stats: LayerStatistics,
    scores: Sequence[float],
    cols: int = 4,
    span_share: float | None = None,
) -> go.Figure:
    """A block layer's top edge functions (the grid `lkat-lens figures` writes and the explorer shows), `cols`
    panels wide, with the share of the grid its inputs occupy when given."""
    title = f"block {block} {layer}: top {len(scores)} edge functions by std over real inputs"
    return edge_curve_figure(curves, stats.coverage, scores=scores, title=title, cols=cols, span_share=span_share)


EDGE_KEY = (
    "φ[q,p]: the edge from input p to output q · σ: std of φ over real inputs (its importance)<br>"
    "grey: where the layer's inputs fall · ▲ RBF centres"
)
SHARED_NOTE = "shared basis: every panel is the same curve, scaled by W[q,p]"


def edge_curve_figure(
    curves: EdgeCurves,
    coverage: Coverage | None = None,
    *,
    scores: Sequence[float] | None = None,
    title: str = "",
    cols: int = 4,
    span_share: float | None = None,
) -> go.Figure:
    """Grid of edge functions phi_{q,p}(x), one panel per edge: curve, grid centres, input distribution behind;
    the key says which share of the grid the inputs occupy (`span_share`, analyses.grid_span) when given.

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
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=labels, horizontal_spacing=0.06, vertical_spacing=spacing)
    x = curves.x.tolist()
    centers = curves.centers.tolist()
    for e in range(n):
        row, col = e // cols + 1, e % cols + 1
        low, high = _y_span(curves.values[e])
        if coverage is not None:
            fig.add_trace(_shade(coverage, low, high).update(showlegend=e == 0, legendgroup="shade"), row=row, col=col)
        fig.add_trace(
            go.Scatter(
                x=x,
                y=curves.values[e].tolist(),
                mode="lines",
                line={"color": CURVE_COLOR, "width": 2},
                name="φ(x), the edge function",
                legendgroup="curve",
                showlegend=e == 0,
            ),
            row=row,
            col=col,
        )
        fig.add_trace(
            go.Scatter(
                x=centers,
                y=[low] * len(centers),
                mode="markers",
                name="RBF centres",
                legendgroup="centres",
                showlegend=e == 0,
                marker={"symbol": "triangle-up", "size": 8, "color": CENTER_COLOR},
            ),
            row=row,
            col=col,
        )
        fig.update_yaxes(range=[low, high], row=row, col=col)
    fig.update_xaxes(range=[x[0], x[-1]], tickformat=".3~g")
    fig.update_yaxes(tickformat=".3~g")
    for col in range(1, cols + 1):
        fig.update_xaxes(title_text="input x", row=rows, col=col)
    fig.update_yaxes(title_text="φ(x)", col=1)
    key = EDGE_KEY + (f"<br>{SHARED_NOTE}" if curves.basis == "shared" else "")
    if span_share is not None:
        key += "<br>" + span_note(span_share, explain=True)
    lines = 2 + key.count("<br>")  # the title and every line of the key, from the top down, then the panel titles
    top = 55 + 19 * lines
    fig.update_layout(
        title={
            "text": f"{title or f'edge functions ({curves.basis} basis)'}<br><sup>{key}</sup>",
            "yref": "container",
            "y": 1,
            "yanchor": "top",
            "pad": {"t": 28},  # below the mode bar
        },
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom"},  # below the axis titles
        template=TEMPLATE,
        barmode="overlay",
        bargap=0,
        width=cols * PANEL_PX + 80,
        height=rows * PANEL_PX + top + 70,
        margin={"l": 40, "r": 20, "t": top, "b": 70},
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
    fig.update_yaxes(autorange="reversed", showticklabels=False, showgrid=False, zeroline=False)
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    for i in range(n_blocks * n_heads):  # square cells in each panel, however wide the figure is drawn
        fig.layout[f"yaxis{i + 1 if i else ''}"].update(scaleanchor=f"x{i + 1 if i else ''}", constrain="domain")
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
    heads = list(range(next(iter(groups.values())).shape[-1]))
    for c, (name, values) in enumerate(groups.items(), start=1):
        fig.add_trace(
            go.Heatmap(z=as_plot_values(values), x=heads, y=gates.blocks, coloraxis="coloraxis", name=name),
            row=1,
            col=c,
        )
        fig.update_xaxes(title_text="head", tickmode="array", tickvals=heads, row=1, col=c)
        # every panel: block 0 at the top, one tick per block, so a row means the same block side by side
        fig.update_yaxes(autorange="reversed", tickmode="array", tickvals=gates.blocks, row=1, col=c)
    fig.update_yaxes(title_text="block", row=1, col=1)
    fig.update_layout(
        title=title or "GLA forget-gate half-life per block and head, by token type (tokens)",
        template=TEMPLATE,
        coloraxis={"colorscale": "Viridis", "colorbar": {"title": "tokens"}},
        width=len(groups) * 200 + 160,
        height=420,
        font={"size": 10},
    )
    return fig


def token_norm_figure(
    norms: TokenNorms, title: str = "", *, patch: tuple[int, int] | None = None, depth: int | None = None
) -> go.Figure:
    """Mean residual-stream norm of each token group across depth, with the patch median and outlier cut.

    `patch` = (image, patch index) adds that patch token's norms as a last trace; `depth` marks one depth.
    """
    depths = list(range(norms.norms.shape[0]))
    fig = go.Figure()
    for name, values in norms.group_norms().items():
        fig.add_trace(go.Scatter(x=depths, y=values.double().mean((1, 2)).tolist(), mode="lines+markers", name=name))
    fig.add_trace(
        go.Scatter(
            x=depths,
            y=norms.patches.flatten(1).median(-1).values.tolist(),
            mode="lines",
            line={"dash": "dot", "color": "gray"},
            name="patch median",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=depths,
            y=norms.thresholds.tolist(),
            mode="lines",
            line={"dash": "dash", "color": "black"},
            name="outlier threshold",
        )
    )
    if patch is not None:
        image, index = patch
        fig.add_trace(
            go.Scatter(
                x=depths,
                y=norms.patches[:, image, index].tolist(),
                mode="lines+markers",
                line={"color": CENTER_COLOR},
                name=f"image {image} patch {index}",
            )
        )
    if depth is not None:
        fig.add_vline(x=depth, line={"color": "gray", "width": 1})
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


TITLE_CHAR_PX = 7  # about the width of one character of a 13 px title


def wrap(text: str, chars: int) -> str:
    """A figure title's lines (split at <br>) broken at spaces into lines of at most `chars` characters."""
    lines = [part for line in text.split("<br>") for part in textwrap.wrap(line, max(chars, 20)) or [""]]
    return "<br>".join(lines)


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
    width = max(cols * 170 + 160, 420)
    title = wrap(title, width // TITLE_CHAR_PX)
    top = 60 + 17 * title.count("<br>")  # room for every line of the title above the panel titles
    fig.update_layout(
        title={"text": title, "font": {"size": 13}},
        template=TEMPLATE,
        width=width,
        height=rows * 170 + top + 20,
        margin={"l": 30, "r": 30, "t": top, "b": 20},
        font={"size": 10},
    )
    fig.update_annotations(font_size=10)
    return fig


def cls_attention_figure(
    attention: ClsAttention,
    images: np.ndarray,
    *,
    patch_size: tuple[int, int],
    title: str = "",
    head: int | None = None,
    names: Sequence[str] | None = None,
) -> go.Figure:
    """Class-token attention on the patches (head mean, or one head) overlaid on each image, one row per block.

    `images` are display images [B, H, W, 3] uint8, titled by `names` (default "image b"). Traces per image: the
    image, then per block the image and a heatmap with z = patch_maps[block, image].mean(heads) (or [..., head]).
    """
    per_head = attention.patch_maps.double()
    maps = per_head.mean(2) if head is None else per_head[:, :, head]  # [L, B, gh, gw]
    n_images = images.shape[0]
    rows = 1 + len(attention.blocks)
    titles = list(names) if names is not None else [f"image {b}" for b in range(n_images)]
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
    heads = "head mean" if head is None else f"head {head}"
    return _finish_image_grid(
        fig, images.shape[1:3], rows, n_images, title or f"class-token attention on the patches ({heads})"
    )


def attribution_figure(
    attribution: Attribution,
    images: np.ndarray,
    title: str = "",
    names: Sequence[str] | None = None,
    class_names: Sequence[str] | None = None,
) -> go.Figure:
    """Each image (top) and its pixel attribution map overlaid on it (bottom, z = attribution.pixel_map[b]).

    `names` label the images (default "image b"); the class explained is added to each label, by its name in
    `class_names` when given (else its index)."""
    pixels = attribution.pixel_map.double()
    n_images = images.shape[0]
    limit = float(pixels.abs().max()) or 1.0
    targets = attribution.target.tolist()
    names = names or [f"image {b}" for b in range(n_images)]
    classes = [class_names[t] if class_names else str(t) for t in targets]
    titles = [f"{names[b]} (class {classes[b]})" for b in range(n_images)]
    titles += [convergence_label(attribution, b) for b in range(n_images)]
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
    title = title or f"{attribution.method} attributions of the predicted class"
    if attribution.converged is False:
        title += f" — NOT converged after {attribution.steps} steps (|Δ| above {IG_TOLERANCE:.0%} of the logit gap)"
    return _finish_image_grid(fig, images.shape[1:3], 2, n_images, title)


def convergence_label(attribution: Attribution, image: int) -> str:
    """The method, and for Integrated Gradients its completeness error |Δ| / |f(x) − f(baseline)| on that image."""
    if attribution.delta_ratio is None:
        return attribution.method
    ratio = float(attribution.delta_ratio[image])
    flag = "" if ratio <= IG_TOLERANCE else " ⚠ not converged"
    return f"{attribution.method} (|Δ| {ratio:.1%} of gap, {attribution.steps} steps){flag}"


def training_curve_figure(metrics: Sequence[Mapping], title: str = "") -> go.Figure:
    """Per-epoch losses (left) and top-k accuracies (right) of a checkpoint's metrics history."""
    epochs = [m.get("epoch", i + 1) for i, m in enumerate(metrics)]
    keys = sorted({k for m in metrics for k in m})
    panels = {1: [k for k in keys if k.endswith("loss")], 2: [k for k in keys if "top" in k]}
    fig = make_subplots(rows=1, cols=2, subplot_titles=["loss", "accuracy (%)"])
    for col, names in panels.items():
        for k in names:
            fig.add_trace(go.Scatter(x=epochs, y=[m.get(k) for m in metrics], mode="lines+markers", name=k), 1, col)
        fig.update_xaxes(title_text="epoch", row=1, col=col)
    fig.update_layout(title=title or "training curves", template=TEMPLATE, height=380)
    return fig


def importance_tiles(
    edge_std: torch.Tensor, max_cells: int = 256
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """A layer's edge importance [out, in] in at most max_cells x max_cells tiles: each tile's strongest edge.

    Returns the tile maxima [rows, cols], their edges [rows, cols, 2] as (q, p) and the tile shape (1 x 1 for
    small layers).
    """
    n_out, n_in = edge_std.shape
    tile = (math.ceil(n_out / max_cells), math.ceil(n_in / max_cells))
    values, index = torch.nn.functional.max_pool2d(
        edge_std.double()[None, None], tile, tile, ceil_mode=True, return_indices=True
    )
    return values[0, 0], torch.stack([index[0, 0] // n_in, index[0, 0] % n_in], dim=-1), tile


def importance_figure(
    edge_std: torch.Tensor, title: str = "", max_cells: int = 256, selected: tuple[int, int] | None = None
) -> go.Figure:
    """Heatmap of a layer's edge importance [out, in], in tiles (importance_tiles) for layers over max_cells wide.

    x and y of a cell are the first input and output channel of its tile (the edge itself for 1 x 1 tiles); z is
    sent as a typed array, so a 256 x 256 map stays small and fast to serve. The `selected` edge (q, p) gets a
    frame around its cell (its tile), the first layout shape.
    """
    values, _, tile = importance_tiles(edge_std, max_cells)
    rows, cols = values.shape
    single = tile == (1, 1)
    hover = "φ[%{y},%{x}]" if single else f"{tile[0]}×{tile[1]} tile from φ[%{{y}},%{{x}}]: strongest"
    fig = go.Figure(
        go.Heatmap(
            z=values.numpy(),
            x=np.arange(cols) * tile[1],
            y=np.arange(rows) * tile[0],
            hovertemplate=hover + "  σ=%{z:.3g}<extra></extra>",
            colorscale="Viridis",
            colorbar={"title": "σ", "tickformat": ".3~g"},
        )
    )
    if selected is not None:
        q, p = selected
        row, col = q // tile[0], p // tile[1]
        fig.add_shape(
            type="rect",
            x0=(col - 0.5) * tile[1],
            x1=(col + 0.5) * tile[1],
            y0=(row - 0.5) * tile[0],
            y1=(row + 0.5) * tile[0],
            line={"color": CENTER_COLOR, "width": 2},
            name=f"φ[{q},{p}]",
        )
    tiles = "" if single else f" (tiles of {tile[0]}×{tile[1]} edges show their strongest)"
    framed = "" if selected is None else f"; framed: φ[{selected[0]},{selected[1]}]"
    fig.update_layout(
        title=(title or "edge importance") + tiles + framed,
        template=TEMPLATE,
        xaxis_title="input channel p",
        yaxis_title="output node q",
        yaxis_autorange="reversed",
        height=460,
    )
    return fig


def coverage_figure(
    coverages: Mapping[str, Coverage],
    centers: Sequence[float] = (),
    title: str = "",
    span_shares: Mapping[str, float] | None = None,
) -> go.Figure:
    """Where each layer's real inputs fall against its RBF grid: histogram, grid support shaded, grid centres.

    Each panel's title gives the share outside the support, off the axis and, from `span_shares` (by the keys of
    `coverages`; analyses.grid_span), the share of the grid the inputs occupy, flagged when it is a sliver."""
    titles = []
    for name, c in coverages.items():
        text = f"{name}: {c.outside_fraction:.1%} outside support, {(c.underflow + c.overflow) / c.total:.1%} off-axis"
        if span_shares is not None and name in span_shares:
            text += "<br>" + span_note(span_shares[name])
        titles.append(text)
    fig = make_subplots(rows=1, cols=max(1, len(coverages)), subplot_titles=titles, horizontal_spacing=0.08)
    for col, coverage in enumerate(coverages.values(), start=1):
        edges = coverage.bin_edges.double()
        share = coverage.counts.double() / max(coverage.total, 1)
        fig.add_trace(
            go.Bar(
                x=((edges[:-1] + edges[1:]) / 2).tolist(),
                y=share.tolist(),
                width=(edges[1:] - edges[:-1]).tolist(),
                marker={"color": CURVE_COLOR, "line": {"width": 0}},
                name="inputs",
                showlegend=False,
            ),
            row=1,
            col=col,
        )
        fig.add_vrect(*coverage.support, fillcolor=SHADE_COLOR, line_width=0, layer="below", row=1, col=col)
        if len(centers):
            fig.add_trace(
                go.Scatter(
                    x=list(centers),
                    y=[0.0] * len(centers),
                    mode="markers",
                    name="grid centres",
                    showlegend=False,
                    marker={"symbol": "triangle-up", "size": 9, "color": CENTER_COLOR},
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text="edge-function input x", row=1, col=col)
    fig.update_yaxes(title_text="share of inputs", row=1, col=1)
    fig.update_layout(
        title=title or "input coverage of the RBF grid (shaded: support [grid_min - h, grid_max + h])",
        template=TEMPLATE,
        bargap=0,
        height=360,
        margin={"t": 110},
        font={"size": 10},
    )
    fig.update_annotations(font_size=10)
    return fig


def edge_fit_figure(
    curves: EdgeCurves, fit: SymbolicFitResult, coverage: Coverage | None = None, title: str = ""
) -> go.Figure:
    """One edge function (the first of `curves`) with its best symbolic fit and the layer's input distribution."""
    q, p = curves.edges[0].tolist()
    y = curves.values[0]
    low, high = _y_span(y)
    fig = go.Figure()
    if coverage is not None:
        fig.add_trace(_shade(coverage, low, high))
    fig.add_trace(
        go.Scatter(
            x=curves.x.tolist(), y=y.tolist(), mode="lines", name=f"φ[{q},{p}]", line={"width": 3, "color": CURVE_COLOR}
        )
    )
    fitted = (curves.x >= curves.centers[0]) & (curves.x <= curves.centers[-1])  # fit_edge's span: the grid's
    fig.add_trace(
        go.Scatter(
            x=curves.x[fitted].tolist(),
            y=fit.best(curves.x[fitted]).tolist(),
            mode="lines",
            name=f"{fit.best.formula()}",
            line={"dash": "dash", "color": CENTER_COLOR},
        )
    )
    fig.add_trace(
        go.Scatter(
            x=curves.centers.tolist(),
            y=[low] * len(curves.centers),
            mode="markers",
            name="grid centres",
            marker={"symbol": "triangle-up", "size": 9, "color": CENTER_COLOR},
        )
    )
    runners = ", ".join(f"{f.name} {f.r2:.3f}" for f in fit.ranking[1:4])
    fig.update_layout(
        title=title or f"φ[{q},{p}] ≈ {fit.best.name} (R² {fit.best.r2:.4f}; next: {runners})",
        template=TEMPLATE,
        xaxis={"title": "input x", "tickformat": ".3~g"},
        yaxis={"title": "φ(x)", "range": [low, high], "tickformat": ".3~g"},
        legend={"orientation": "h", "y": -0.2},
        height=400,
    )
    return fig


def gate_channel_figure(gates: GateStats, block: int, head: int, title: str = "") -> go.Figure:
    """Half-life of each key channel of one block and head, one trace per token group (log scale)."""
    i = gates.blocks.index(block)
    fig = go.Figure()
    for name, values in gates.half_life_by_type.items():
        channel = values[i, head]
        fig.add_trace(
            go.Scatter(x=list(range(channel.numel())), y=as_plot_values(channel), mode="lines+markers", name=name)
        )
    fig.update_layout(
        title=title or f"block {block} head {head}: forget-gate half-life per key channel (tokens; gap = no decay)",
        template=TEMPLATE,
        xaxis_title="key channel",
        yaxis={"title": "half-life (tokens)", "type": "log"},
        height=380,
    )
    return fig


def patch_map_figure(
    values: torch.Tensor,
    image: np.ndarray,
    *,
    patch_size: tuple[int, int],
    title: str = "",
    selected: int | None = None,
    marked: torch.Tensor | None = None,
    signed: bool = False,
    colorbar: str = "",
) -> go.Figure:
    """A patch-grid map [gh, gw] over one display image [H, W, 3] (right), beside the image alone (left), so a map
    of a few large patches never hides a small image; `selected` patch framed in both, `marked` patches ×.

    Traces: the image under the map, the heatmap (z = values), the marked patches' centres when `marked` is given,
    then the image alone. Both panels are in image pixels, so a click on either names the same patch.
    """
    gw = values.shape[1]
    ph, pw = patch_size
    fig = make_subplots(rows=1, cols=2, column_widths=[0.4, 0.6], horizontal_spacing=0.04)
    fig.add_trace(go.Image(z=image, opacity=0.6, name="image"), row=1, col=2)
    style = {"colorscale": "RdBu", "zmid": 0} if signed else {"colorscale": "Viridis"}
    heat = _heat_on_image(values, patch_size, opacity=0.7, colorbar={"title": colorbar}, name="map", **style)
    fig.add_trace(heat, row=1, col=2)
    if marked is not None:
        rows, cols = marked.nonzero(as_tuple=True)
        fig.add_trace(
            go.Scatter(
                x=(cols * pw + (pw - 1) / 2).tolist(),
                y=(rows * ph + (ph - 1) / 2).tolist(),
                mode="markers",
                marker={"symbol": "x", "size": 12, "color": "black", "line": {"width": 1, "color": "white"}},
                name="outliers",
            ),
            row=1,
            col=2,
        )
    fig.add_trace(go.Image(z=image, name="image alone"), row=1, col=1)
    if selected is not None:
        r, c = divmod(selected, gw)
        frame = {"x0": c * pw - 0.5, "x1": (c + 1) * pw - 0.5, "y0": r * ph - 0.5, "y1": (r + 1) * ph - 0.5}
        for col in (1, 2):
            fig.add_shape(type="rect", **frame, line={"color": CENTER_COLOR, "width": 3}, row=1, col=col)
    axes = _overlay_axes(image.shape[:2])
    fig.update_xaxes(**axes["x"])
    fig.update_yaxes(**axes["y"])
    fig.update_yaxes(scaleanchor="x", row=1, col=1)
    fig.update_yaxes(scaleanchor="x2", row=1, col=2)
    fig.update_layout(
        title={"text": title, "font": {"size": 12}},
        template=TEMPLATE,
        width=620,
        height=400,
        margin={"l": 20, "r": 20, "t": 70, "b": 20},
        showlegend=False,
    )
    return fig


def faithfulness_figure(curves: FaithfulnessCurves, title: str = "") -> go.Figure:
    """Deletion and insertion curves (target-class probability vs fraction of units), one pair per image."""
    fig = go.Figure()
    x = curves.fractions.tolist()
    for b in range(curves.deletion.shape[0]):
        for name, values, auc in (
            ("deletion", curves.deletion[b], curves.deletion_auc[b]),
            ("insertion", curves.insertion[b], curves.insertion_auc[b]),
        ):
            fig.add_trace(
                go.Scatter(x=x, y=values.tolist(), mode="lines+markers", name=f"{name} (AUC {float(auc):.3f})")
            )
    fig.update_layout(
        title=title or f"deletion / insertion of the most-attributed {curves.unit}es ({curves.replacement})",
        template=TEMPLATE,
        xaxis_title=f"fraction of {curves.unit}es",
        yaxis={"title": "target-class probability", "range": [0, 1.02]},
        height=380,
    )
    return fig


def probe_figure(results: ProbeResults, depth: int | None = None, title: str = "") -> go.Figure:
    """Held-out (solid) and training (dotted) linear-probe accuracy per depth and feature kind, chance dashed."""
    depths = list(range(len(results.depth_names)))
    fig = go.Figure()
    for kind, accuracy in results.test_accuracy.items():
        fig.add_trace(
            go.Scatter(
                x=depths,
                y=accuracy.tolist(),
                mode="lines+markers",
                name=f"{kind} (held out)",
                text=results.depth_names,
            )
        )
        fig.add_trace(
            go.Scatter(
                x=depths,
                y=results.train_accuracy[kind].tolist(),
                mode="lines",
                line={"dash": "dot"},
                name=f"{kind} (train)",
            )
        )
    fig.add_hline(y=results.chance, line={"dash": "dash", "color": "gray"}, annotation_text="chance")
    if depth is not None:
        fig.add_vline(x=depth, line={"color": "gray", "width": 1})
    fig.update_layout(
        title=title
        or f"linear probes per depth ({results.num_train} train / {results.num_test} held-out images; 0 = embedding)",
        template=TEMPLATE,
        xaxis={"title": "depth", "tickmode": "array", "tickvals": depths},
        yaxis={"title": "accuracy", "range": [0, 1.02]},
        height=400,
    )
    return fig
