"""Overview: the model card and training curves of a checkpoint (and of the compared one)."""

from __future__ import annotations

import dash
import plotly.graph_objects as go
from dash import Input, Output, dcc, html

from lkat_lens import figures
from lkat_lens.apps.state import CheckpointState, ExplorerState
from lkat_lens.study import format_card

from .common import compare_panel, fill_pane, graph, label, side_by_side, static_graph

TAB = "overview"


def tab(state: ExplorerState) -> dcc.Tab:
    """The Overview tab."""
    main = [html.Pre(id="model-card"), graph("training-curves")]
    return dcc.Tab(label="Overview", value=TAB, children=side_by_side(main, "compare-overview"))


def card_text(ckpt: CheckpointState) -> str:
    """The model card as aligned `key: value` lines."""
    return format_card(ckpt.card())


def curves(ckpt: CheckpointState) -> go.Figure:
    """The checkpoint's training curves."""
    return figures.training_curve_figure(ckpt.info.metrics, f"training curves of {label(ckpt)}")


def register(app: dash.Dash, state: ExplorerState) -> None:
    """Overview callbacks."""

    @app.callback(Output("model-card", "children"), Output("training-curves", "figure"), Input("checkpoint", "value"))
    def overview(index: int) -> tuple[str, go.Figure]:
        """The model card and training curves of the checkpoint."""
        return card_text(state[index]), fill_pane(curves(state[index]))

    @app.callback(Output("compare-overview", "children"), Input("compare", "value"))
    def compare(index: int | None) -> list:
        """The compared checkpoint's card and curves."""
        return compare_panel(
            state, index, lambda c: [html.Pre(card_text(c)), static_graph("compare-training-curves", curves(c))]
        )
