"""Probes: how linearly decodable the labels are at each depth (fitted once, when the tab first opens)."""

from __future__ import annotations

import dash
import plotly.graph_objects as go
from dash import Input, Output, dcc, html

from lkat_lens import figures
from lkat_lens.apps.state import CheckpointState, ExplorerState
from lkat_lens.study import NeedsLabelsError

from .common import compare_panel, fill_pane, graph, message_figure, require_tab, side_by_side, static_graph

TAB = "probes"


def tab(state: ExplorerState) -> dcc.Tab:
    """The Probes tab."""
    note = (
        f"Logistic-regression probes on the class token and the mean patch token, fitted on "
        f"{state[0].defaults.probe_images} training images and scored on the explorer's sample; "
        "the line marks the block."
    )
    return dcc.Tab(
        label="Probes", value=TAB, children=side_by_side([html.P(note), graph("probe-figure")], "compare-probes")
    )


def probe_figure(ckpt: CheckpointState, depth: int) -> go.Figure:
    """Probe accuracy per depth with `depth` marked, or why there is none (a sample without labels)."""
    try:
        return figures.probe_figure(ckpt.probes(), depth=depth)
    except NeedsLabelsError as err:
        return message_figure(str(err))


def register(app: dash.Dash, state: ExplorerState) -> None:
    """Probe callbacks."""

    @app.callback(
        Output("probe-figure", "figure"), Input("tabs", "value"), Input("checkpoint", "value"), Input("block", "value")
    )
    def probe(tab_value: str, index: int, block: int) -> go.Figure:
        """Probe accuracy per depth, the current block's output marked."""
        require_tab(tab_value, TAB)
        return fill_pane(probe_figure(state[index], depth=block + 1))

    @app.callback(
        Output("compare-probes", "children"), Input("tabs", "value"), Input("compare", "value"), Input("block", "value")
    )
    def compare(tab_value: str, index: int | None, block: int) -> list:
        """The compared checkpoint's probe accuracy per depth (fitted when first shown)."""
        require_tab(tab_value, TAB)

        def panels(ckpt) -> list:
            depth = min(block, ckpt.num_blocks - 1) + 1
            return [static_graph("compare-probe-figure", probe_figure(ckpt, depth=depth))]

        return compare_panel(state, index, panels)
