"""The Dash app of `lkat-lens explore`: a factory that loads checkpoints and lays out the page."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import dash
from dash import dcc, html

from lkat_lens.apps.views.attributions import BROWSER_UPLOAD_CAP
from lkat_lens.runs import checkpoint_of, run_folder_of

from . import callbacks
from .state import CheckpointState, ExplorerState
from .views import VIEWS

__all__ = ["BROWSER_UPLOAD_CAP", "MAX_REQUEST_BYTES", "create_app", "layout"]

# Largest HTTP request body the server reads (Flask answers 413 above it): the biggest file the browser sends,
# base64-encoded (4/3) inside a callback's JSON, with room to spare.
MAX_REQUEST_BYTES = 2 * BROWSER_UPLOAD_CAP


def dropdown(component_id: str, options: list, width: str = "6em", **kwargs) -> dcc.Dropdown:
    """A compact dropdown selector."""
    kwargs.setdefault("value", 0)
    kwargs.setdefault("clearable", False)
    return dcc.Dropdown(id=component_id, options=options, style={"width": width}, **kwargs)


def block_bar(num_blocks: int) -> html.Div:
    """The block selector shared by every view, with prev/next buttons (keys [ and ] too)."""
    return html.Div(
        [
            html.Button("◀ prev", id="prev-block", n_clicks=0, title="previous block ([ or ←)"),
            html.Label("block", htmlFor="block"),
            dropdown("block", [{"label": str(b), "value": b} for b in range(num_blocks)]),
            html.Button("next ▶", id="next-block", n_clicks=0, title="next block (] or →)"),
        ],
        style={"display": "flex", "alignItems": "center", "gap": "0.5em"},
    )


def controls(state: ExplorerState) -> html.Div:
    """Checkpoint, compare, block, image and head selectors, and the selected patch."""
    checkpoints = [{"label": name, "value": i} for i, name in enumerate(state.labels())]
    first = state[0]
    images = [
        {"label": f"{i} ({first.class_name(int(first.sample.labels[i]))})", "value": i} for i in range(state.num_images)
    ]
    return html.Div(
        [
            dropdown("checkpoint", checkpoints, width="18em"),
            html.Label("compare with", htmlFor="compare"),
            dropdown("compare", checkpoints, width="18em", value=None, clearable=True, placeholder="none"),
            block_bar(state.num_blocks),
            html.Label("image", htmlFor="image"),
            dropdown("image", images, width="8em"),
            html.Label("head", htmlFor="head"),
            dropdown("head", [{"label": str(h), "value": h} for h in range(state.num_heads)]),
            html.Span(id="patch-label"),
            dcc.Store(id="patch"),
        ],
        style={"display": "flex", "alignItems": "center", "gap": "0.8em", "flexWrap": "wrap"},
    )


def layout(state: ExplorerState) -> html.Div:
    """The page: URL, selectors, always-visible predictions and the tabbed views."""
    return html.Div(
        [
            dcc.Location(id="url", refresh=False),
            html.H2("lkat-lens explorer"),
            controls(state),
            html.Div(id="predictions", style={"margin": "0.5em 0", "fontFamily": "monospace"}),
            dcc.Tabs(id="tabs", value="overview", children=[view.tab(state) for view in VIEWS]),
        ],
        style={"fontFamily": "sans-serif", "margin": "1em"},
    )


def create_app(
    checkpoints: Sequence[str | os.PathLike] | str | os.PathLike,
    *,
    data: str | None = None,
    data_dir: str | os.PathLike = "data",
    masks_dir: str | os.PathLike | None = None,
    num_images: int = 32,
    edges: int = 8,
    probe_images: int = 256,
    device: str | None = None,
    batch_size: int = 64,
) -> dash.Dash:
    """The explorer app for one or more checkpoints or run folders (their samples loaded, analyses computed on
    demand); a run folder opens as its best.pt, and its epoch snapshots join the checkpoint and compare lists."""
    given = [checkpoints] if isinstance(checkpoints, (str, os.PathLike)) else list(checkpoints)
    settings = {"data": data, "data_dir": data_dir, "masks_dir": masks_dir, "num_images": num_images, "edges": edges}
    settings |= {"device": device, "batch_size": batch_size}

    def load(path: Path) -> CheckpointState:
        return CheckpointState(path, probe_images=probe_images, **settings)

    main = [load(checkpoint_of(p)) for p in given]
    runs = [run_folder_of(p) for p in given if Path(p).is_dir()]
    snapshots = [path for run in runs for _, path in run.snapshots]
    state = ExplorerState(main, snapshots, load)
    app = dash.Dash(__name__, title="lkat-lens explorer")
    app.server.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
    app.layout = layout(state)
    callbacks.register(app, state)
    app.explorer_state = state
    return app
