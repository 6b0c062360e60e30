"""Edge functions: a block's top-k fc1/fc2 curves, input coverage, importance heatmap and one clicked edge's fit."""

from __future__ import annotations

from typing import Any

import dash
import plotly.graph_objects as go
from dash import Input, Output, dcc, html

from lkat_lens import figures
from lkat_lens.apps.state import CheckpointState, ExplorerState

from .common import (
    block_message,
    compare_panel,
    fill_pane,
    fill_panes,
    graph,
    message_figure,
    require_tab,
    side_by_side,
    static_graph,
)

TAB = "edges"
LAYERS = ("fc1", "fc2")
COLUMNS = 4  # panels per row of a curve grid with the page to itself
COMPARE_COLUMNS = 2  # ... and in half of it, beside the compared checkpoint


def tab(state: ExplorerState) -> dcc.Tab:
    """The Edge functions tab."""
    main = [
        graph("fc1-curves"),
        graph("fc2-curves"),
        graph("edge-coverage"),
        dcc.RadioItems(id="edge-layer", options=list(LAYERS), value=LAYERS[0], inline=True),
        html.P("Click a cell of the heatmap to see that edge's curve and symbolic fit (the link keeps it)."),
        dcc.Store(id="edge"),
        graph("edge-importance"),
        graph("edge-detail"),
    ]
    return dcc.Tab(label="Edge functions", value=TAB, children=side_by_side(main, "compare-edges"))


def not_applicable(ckpt: CheckpointState, block: int) -> str | None:
    """Why the checkpoint has no edge functions to show at this block, or None."""
    if not ckpt.has_kan:
        return f"not applicable: {ckpt.info.model_name} has no KAN layers"
    return block_message(ckpt, block)


def block_figures(ckpt: CheckpointState, block: int, cols: int = COLUMNS) -> list[go.Figure]:
    """fc1 and fc2 top-k curves of a block (grids `cols` panels wide) and the input coverage of both (built once
    per block and width)."""
    reason = not_applicable(ckpt, block)
    if reason:
        return [message_figure(reason)] * 3
    return ckpt.cached(("edge_figures", block, cols), lambda: build_block_figures(ckpt, block, cols))


def build_block_figures(ckpt: CheckpointState, block: int, cols: int) -> list[go.Figure]:
    """fc1 and fc2 top-k curves of a block and the input coverage of both."""
    layers = ckpt.block_layers(block)
    figs, coverages, shares, centers = [], {}, {}, []
    for short in LAYERS:
        if short not in layers:
            figs.append(message_figure(f"block {block} has no KAN {short}"))
            continue
        curves, scores, stats = ckpt.edge_curves(block, short)
        shares[short] = ckpt.span_share(block, short)
        figs.append(figures.edge_layer_figure(block, short, curves, stats, scores, cols=cols, span_share=shares[short]))
        coverages[short] = stats.coverage
        centers = curves.centers.tolist()
    title = f"block {block}: input coverage of the RBF grid (shaded: support [grid_min - h, grid_max + h])"
    return [*figs, figures.coverage_figure(coverages, centers, title=title, span_shares=shares)]


def layer_missing(ckpt: CheckpointState, block: int, layer: str) -> str | None:
    """Why the checkpoint has no such KAN layer at this block, or None."""
    reason = not_applicable(ckpt, block)
    if reason is None and layer not in ckpt.block_layers(block):
        reason = f"block {block} has no KAN {layer}"
    return reason


def importance(ckpt: CheckpointState, block: int, layer: str, edge: dict[str, Any] | None = None) -> go.Figure:
    """The importance heatmap of a block's layer with the chosen edge framed (the clicked one, or the most
    important; built once per block, layer and edge)."""
    reason = layer_missing(ckpt, block, layer)
    if reason:
        return message_figure(reason)
    selected = chosen_edge(ckpt, block, layer, edge)

    def build() -> go.Figure:
        edge_std = ckpt.edge_importance(block, layer).edge_std
        return figures.importance_figure(edge_std, f"block {block} {layer}: edge importance", selected=selected)

    return ckpt.cached(("importance_figure", block, layer, selected), build)


def clicked_edge(ckpt: CheckpointState, block: int, layer: str, point: dict[str, Any]) -> tuple[int, int]:
    """The edge shown where the heatmap of a block's layer was clicked (x, y: the tile's first channels)."""
    _, edges, tile = figures.importance_tiles(ckpt.edge_importance(block, layer).edge_std)
    q, p = edges[int(point["y"]) // tile[0], int(point["x"]) // tile[1]].tolist()
    return q, p


def chosen_edge(ckpt: CheckpointState, block: int, layer: str, edge: dict[str, Any] | None) -> tuple[int, int]:
    """The selected edge when it belongs to this block and layer and exists there, else the most important one."""
    importance = ckpt.edge_importance(block, layer)
    if edge and edge.get("block") == block and edge.get("layer") == layer:
        q, p = int(edge["q"]), int(edge["p"])
        if q < importance.edge_std.shape[0] and p < importance.edge_std.shape[1]:
            return q, p
    return ckpt.cached(("top_edge", block, layer), lambda: tuple(importance.top_edges(1)[0][:2]))


def edge_detail(ckpt: CheckpointState, block: int, layer: str, edge: dict[str, Any] | None) -> go.Figure:
    """One edge's curve with its symbolic fit (the clicked one, or the most important)."""
    reason = layer_missing(ckpt, block, layer)
    if reason:
        return message_figure(reason)
    q, p = chosen_edge(ckpt, block, layer, edge)

    def build() -> go.Figure:
        curves, fit = ckpt.edge_fit(block, layer, (q, p))
        stats = ckpt.layer_statistics()[ckpt.block_layers(block)[layer]]
        title = f"block {block} {layer} φ[{q},{p}] ≈ {fit.best.formula()}  (R² {fit.best.r2:.4f})"
        return figures.edge_fit_figure(curves, fit, stats.coverage, title=title)

    return ckpt.cached(("edge_detail", block, layer, q, p), build)


def register(app: dash.Dash, state: ExplorerState) -> None:
    """Edge-function callbacks."""

    @app.callback(
        Output("fc1-curves", "figure"),
        Output("fc2-curves", "figure"),
        Output("edge-coverage", "figure"),
        Input("tabs", "value"),
        Input("checkpoint", "value"),
        Input("block", "value"),
        Input("compare", "value"),
    )
    def curves(tab_value: str, index: int, block: int, compare: int | None) -> list[go.Figure]:
        """Curves and coverage of the block, in narrower grids while the compare column takes half the page."""
        require_tab(tab_value, TAB)
        return fill_panes(block_figures(state[index], block, COLUMNS if compare is None else COMPARE_COLUMNS))

    @app.callback(
        Output("edge-importance", "figure"),
        Input("tabs", "value"),
        Input("checkpoint", "value"),
        Input("block", "value"),
        Input("edge-layer", "value"),
        Input("edge", "data"),
    )
    def heatmap(tab_value: str, index: int, block: int, layer: str, edge: dict[str, Any] | None) -> go.Figure:
        """Importance heatmap of the block's chosen layer, the chosen edge framed."""
        require_tab(tab_value, TAB)
        return fill_pane(importance(state[index], block, layer, edge))

    @app.callback(
        Output("edge-detail", "figure"),
        Input("tabs", "value"),
        Input("checkpoint", "value"),
        Input("block", "value"),
        Input("edge-layer", "value"),
        Input("edge", "data"),
    )
    def detail(tab_value: str, index: int, block: int, layer: str, edge: dict[str, Any] | None) -> go.Figure:
        """The chosen edge's curve and symbolic fit."""
        require_tab(tab_value, TAB)
        return fill_pane(edge_detail(state[index], block, layer, edge))

    @app.callback(
        Output("compare-edges", "children"),
        Input("tabs", "value"),
        Input("compare", "value"),
        Input("block", "value"),
        Input("edge-layer", "value"),
    )
    def compare(tab_value: str, index: int | None, block: int, layer: str) -> list:
        """The same block's curves and importance in the compared checkpoint."""
        require_tab(tab_value, TAB)

        def panels(ckpt: CheckpointState) -> list:
            fc1, fc2, _ = block_figures(ckpt, block, COMPARE_COLUMNS)
            return [
                static_graph("compare-fc1-curves", fc1),
                static_graph("compare-fc2-curves", fc2),
                static_graph("compare-edge-importance", importance(ckpt, block, layer)),
            ]

        return compare_panel(state, index, panels)
