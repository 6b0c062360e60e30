"""Pieces every view uses: figure slots with spinners, messages, the compare column and tab gating."""

from __future__ import annotations

from collections.abc import Callable

import plotly.graph_objects as go
from dash import dcc, html
from dash.exceptions import PreventUpdate

from lkat_lens.apps.state import CheckpointState, ExplorerState

GRAPH_CONFIG = {"displaylogo": False}


def graph(graph_id: str) -> dcc.Loading:
    """A figure slot with a spinner while its callback runs."""
    return dcc.Loading(dcc.Graph(id=graph_id, config=GRAPH_CONFIG), type="circle")


def static_graph(graph_id: str, figure: go.Figure) -> dcc.Graph:
    """A figure drawn once, for panels a callback builds whole (the compare column)."""
    return dcc.Graph(id=graph_id, figure=fill_pane(figure), config=GRAPH_CONFIG)


def fill_pane(figure: go.Figure) -> go.Figure:
    """The figure as wide as its pane (the builders' fixed widths are for PNG files), so the page stays readable
    side by side at any window width; its height stays the builder's. Changes the figure itself (cheap, and the
    same for every call, so cached figures can go through it again)."""
    if figure.layout.width is None and figure.layout.autosize:  # a cached figure that went through already
        return figure
    return figure.update_layout(width=None, autosize=True)


def fill_panes(figures: list[go.Figure]) -> list[go.Figure]:
    """fill_pane of each figure."""
    return [fill_pane(f) for f in figures]


def message_figure(text: str) -> go.Figure:
    """An empty figure that says why there is nothing to draw."""
    fig = go.Figure()
    fig.add_annotation(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(title=text, xaxis_visible=False, yaxis_visible=False, height=200)
    return fig


def label(ckpt: CheckpointState) -> str:
    """How the page names a checkpoint: its run folder and file name."""
    return f"{ckpt.path.parent.name}/{ckpt.path.name}"


def side_by_side(main: list, compare_id: str) -> html.Div:
    """The view's own panels and, next to them, the compare column that a callback fills: two equal halves while
    it has content, the whole width for the view otherwise (assets/explorer.css)."""
    return html.Div(
        [
            html.Div(main, className="view-pane"),
            dcc.Loading(
                html.Div(id=compare_id, className="compare-column"), type="circle", parent_className="compare-pane"
            ),
        ],
        className="side-by-side",
    )


def compare_panel(state: ExplorerState, index: int | None, build: Callable[[CheckpointState], list]) -> list:
    """The compare column: nothing without a second checkpoint, else its heading and the panels `build` makes."""
    if index is None:
        return []
    ckpt = state[index]
    return [html.H4(f"compare: {label(ckpt)} ({ckpt.info.model_name})"), *build(ckpt)]


def require_tab(current: str, tab: str) -> None:
    """Skip a view's callback while its tab is hidden (it runs when the tab opens)."""
    if current != tab:
        raise PreventUpdate


def block_message(ckpt: CheckpointState, block: int) -> str | None:
    """Why a checkpoint cannot show a block (it has fewer), or None."""
    return None if block < ckpt.num_blocks else f"{label(ckpt)} has blocks 0..{ckpt.num_blocks - 1} only"


def patch_or_centre(ckpt: CheckpointState, patch: int | None) -> int:
    """The selected patch, or the centre patch when none (or one beyond this checkpoint's grid) is selected."""
    rows, cols = ckpt.grid_size
    return patch if patch is not None and patch < rows * cols else (rows // 2) * cols + cols // 2


def head_of(ckpt: CheckpointState, head: int) -> int:
    """The selected head, clamped to the checkpoint's heads."""
    return min(int(head or 0), ckpt.num_heads - 1)
