"""The Dash app of `lkat-lens explore`: a factory that loads checkpoints and lays out the views."""

from __future__ import annotations

import os
from collections.abc import Sequence

import dash
from dash import dcc, html
from lkat_lens.apps import callbacks
from lkat_lens.apps.state import MAX_UPLOAD_BYTES, CheckpointState, ExplorerState

BROWSER_UPLOAD_CAP = 4 * MAX_UPLOAD_BYTES  # dcc.Upload drops larger files in the browser, without a message
METHODS = ("integrated_gradients", "saliency", "input_x_gradient", "gradient_shap")


def graph(graph_id: str) -> dcc.Loading:
    """A figure slot with a spinner while its callback runs."""
    return dcc.Loading(dcc.Graph(id=graph_id, config={"displaylogo": False}), type="circle")


def block_bar(num_blocks: int) -> html.Div:
    """The block selector shared by every view, with prev/next buttons."""
    return html.Div(
        [
            html.Button("◀ prev", id="prev-block", n_clicks=0),
            html.Label("block", htmlFor="block", style={"margin": "0 0.5em"}),
            dcc.Dropdown(
                id="block",
                options=[{"label": str(b), "value": b} for b in range(num_blocks)],
                value=0,
                clearable=False,
                style={"width": "6em"},
            ),
            html.Button("next ▶", id="next-block", n_clicks=0),
        ],
        style={"display": "flex", "alignItems": "center", "gap": "0.5em"},
    )


def controls(state: ExplorerState) -> html.Div:
    """Checkpoint, block and image selectors."""
    first = state[0]
    return html.Div(
        [
            dcc.Dropdown(
                id="checkpoint",
                options=[{"label": c.path.name, "value": i} for i, c in enumerate(state.checkpoints)],
                value=0,
                clearable=False,
                style={"width": "20em"},
            ),
            block_bar(state.num_blocks),
            html.Label("image", htmlFor="image"),
            dcc.Dropdown(
                id="image",
                options=[{"label": str(i), "value": i} for i in range(len(first.sample.labels))],
                value=0,
                clearable=False,
                style={"width": "6em"},
            ),
        ],
        style={"display": "flex", "alignItems": "center", "gap": "1em", "flexWrap": "wrap"},
    )


def attribution_tab() -> dcc.Tab:
    """Attributions of the current image or of an uploaded one."""
    return dcc.Tab(
        label="Attributions",
        value="attributions",
        children=[
            dcc.Dropdown(
                id="method",
                options=[{"label": m, "value": m} for m in METHODS],
                value=METHODS[0],
                clearable=False,
                style={"width": "20em"},
            ),
            dcc.Upload(
                id="upload",
                children=html.Div(
                    [
                        "Drop an image here or ",
                        html.A("choose a file"),
                        f" (PNG/JPEG, at most {MAX_UPLOAD_BYTES // 2**20} MiB)",
                    ]
                ),
                max_size=BROWSER_UPLOAD_CAP,
                multiple=False,
                style={"border": "1px dashed #888", "padding": "1em", "margin": "0.5em 0", "textAlign": "center"},
            ),
            html.Div(id="upload-message", role="alert", style={"color": "#b00020"}),
            graph("attribution-figure"),
        ],
    )


def layout(state: ExplorerState) -> html.Div:
    """The page: URL, selectors, always-visible predictions and the tabbed views."""
    tabs = [
        dcc.Tab(
            label="Overview",
            value="overview",
            children=[html.Pre(id="model-card"), graph("training-curves")],
        ),
        dcc.Tab(
            label="Edge functions",
            value="edges",
            children=[graph("fc1-curves"), graph("fc2-curves"), graph("edge-importance")],
        ),
        dcc.Tab(
            label="Gates & attention",
            value="gates",
            children=[graph("gate-half-life"), graph("gate-heads"), graph("cls-attention")],
        ),
        dcc.Tab(label="Tokens", value="tokens", children=[graph("token-norms")]),
        attribution_tab(),
    ]
    return html.Div(
        [
            dcc.Location(id="url", refresh=False),
            html.H2("lkat-lens explorer"),
            controls(state),
            html.Div(id="predictions", style={"margin": "0.5em 0", "fontFamily": "monospace"}),
            dcc.Tabs(id="tabs", value="overview", children=tabs),
        ],
        style={"fontFamily": "sans-serif", "margin": "1em"},
    )


def create_app(
    checkpoints: Sequence[str | os.PathLike] | str | os.PathLike,
    *,
    data: str | None = None,
    data_dir: str | os.PathLike = "data",
    num_images: int = 32,
    edges: int = 8,
) -> dash.Dash:
    """The explorer app for one or more checkpoints (their samples loaded, analyses computed on demand)."""
    paths = [checkpoints] if isinstance(checkpoints, (str, os.PathLike)) else list(checkpoints)
    state = ExplorerState(
        [CheckpointState(p, data=data, data_dir=data_dir, num_images=num_images, edges=edges) for p in paths]
    )
    app = dash.Dash(__name__, title="lkat-lens explorer")
    app.layout = layout(state)
    callbacks.register(app, state)
    app.explorer_state = state
    return app
