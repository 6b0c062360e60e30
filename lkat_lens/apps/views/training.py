"""Training: how the model learned, from its run folder — telemetry over epochs and a block's curves per snapshot."""

from __future__ import annotations

from typing import Any

import dash
import plotly.graph_objects as go
from dash import Input, Output, dcc, html

from lkat_lens import figures
from lkat_lens.apps.state import CheckpointState, ExplorerState
from lkat_lens.figures.training import QUANTITIES, telemetry_figure
from lkat_lens.runs import run_folder_of

from .common import block_message, fill_pane, graph, message_figure, require_tab

TAB = "training"
NO_TELEMETRY = "no telemetry: open a run folder of lkat-lens train (it writes telemetry.jsonl unless --no-telemetry)"
NO_SNAPSHOTS = "no epoch snapshots in this run folder (train with --snapshot-every N)"


def tab(state: ExplorerState) -> dcc.Tab:
    """The Training tab."""
    quantities = [{"label": title, "value": name} for name, (title, *_) in QUANTITIES.items()]
    scope = [{"label": "selected block", "value": "block"}, {"label": "all blocks", "value": "all"}]
    return dcc.Tab(
        label="Training",
        value=TAB,
        children=[
            html.Div(
                [
                    dcc.Dropdown(
                        id="telemetry-quantity",
                        options=quantities,
                        value="kan_output_residual_ratio",
                        clearable=False,
                        style={"width": "32em"},
                    ),
                    dcc.RadioItems(id="telemetry-scope", options=scope, value="block", inline=True),
                ],
                style={"display": "flex", "gap": "1em", "alignItems": "center"},
            ),
            graph("telemetry-figure"),
            html.H4("The block's top fc1 edge functions at an epoch snapshot"),
            dcc.Slider(id="snapshot-epoch", min=0, max=0, step=None, marks={}, value=None),
            graph("snapshot-curves"),
        ],
    )


def telemetry(ckpt: CheckpointState, quantity: str, blocks: list[int] | None) -> go.Figure:
    """One telemetry quantity of the checkpoint's run over epochs, for the chosen blocks."""
    run = run_folder_of(ckpt.path)
    records = run.telemetry() if run else []
    if not records:
        return message_figure(NO_TELEMETRY)
    return telemetry_figure(records, quantity, blocks)


def snapshot_marks(state: ExplorerState, ckpt: CheckpointState) -> dict[int, str]:
    """Slider marks: the epochs the checkpoint's run folder kept snapshots of."""
    return {epoch: str(epoch) for epoch, _ in state.snapshots_of(ckpt)}


def snapshot_curves(state: ExplorerState, ckpt: CheckpointState, block: int, epoch: int | None) -> go.Figure:
    """The block's top fc1 curves in the snapshot of one epoch (its own importance ranking on its own sample)."""
    snapshots = dict(state.snapshots_of(ckpt))
    if epoch not in snapshots:
        return message_figure(NO_SNAPSHOTS)
    snapshot = state.at(snapshots[epoch])
    reason = block_message(snapshot, block) or (None if snapshot.block_layers(block) else "no KAN layers")
    if reason:
        return message_figure(reason)
    curves, scores, stats = snapshot.edge_curves(block, "fc1")
    fig = figures.edge_layer_figure(block, "fc1", curves, stats, scores, span_share=snapshot.span_share(block, "fc1"))
    fig.update_layout(title=f"epoch {epoch}: {fig.layout.title.text}")
    return fig


def register(app: dash.Dash, state: ExplorerState) -> None:
    """Training callbacks."""

    @app.callback(
        Output("telemetry-figure", "figure"),
        Input("tabs", "value"),
        Input("checkpoint", "value"),
        Input("block", "value"),
        Input("telemetry-quantity", "value"),
        Input("telemetry-scope", "value"),
    )
    def draw_telemetry(tab_value: str, index: int, block: int, quantity: str, scope: str) -> go.Figure:
        """The chosen quantity over epochs for the selected block (or every block)."""
        require_tab(tab_value, TAB)
        return fill_pane(telemetry(state[index], quantity, None if scope == "all" else [block]))

    @app.callback(
        Output("snapshot-epoch", "marks"),
        Output("snapshot-epoch", "min"),
        Output("snapshot-epoch", "max"),
        Output("snapshot-epoch", "value"),
        Input("tabs", "value"),
        Input("checkpoint", "value"),
    )
    def epochs(tab_value: str, index: int) -> tuple[dict[int, str], int, int, Any]:
        """One slider stop per snapshot of the checkpoint's run, the last one selected."""
        require_tab(tab_value, TAB)
        marks = snapshot_marks(state, state[index])
        if not marks:
            return {}, 0, 0, None
        return marks, min(marks), max(marks), max(marks)

    @app.callback(
        Output("snapshot-curves", "figure"),
        Input("tabs", "value"),
        Input("checkpoint", "value"),
        Input("block", "value"),
        Input("snapshot-epoch", "value"),
    )
    def draw_snapshot(tab_value: str, index: int, block: int, epoch: int | None) -> go.Figure:
        """The block's curves at the chosen snapshot."""
        require_tab(tab_value, TAB)
        return fill_pane(snapshot_curves(state, state[index], block, epoch))
