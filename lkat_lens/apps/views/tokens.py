"""Tokens: residual-stream norms across depth by token type, and the outlier patches of the current image."""

from __future__ import annotations

import dash
import plotly.graph_objects as go
from dash import Input, Output, dcc, html

from lkat_lens import figures
from lkat_lens.apps.state import CheckpointState, ExplorerState

from .common import (
    block_message,
    compare_panel,
    fill_panes,
    graph,
    message_figure,
    patch_or_centre,
    require_tab,
    side_by_side,
    static_graph,
)

TAB = "tokens"


def tab(state: ExplorerState) -> dcc.Tab:
    """The Tokens tab."""
    main = [
        graph("token-norms"),
        html.P("Click a patch on the image to follow its norm across depth."),
        graph("token-outliers"),
    ]
    return dcc.Tab(label="Tokens", value=TAB, children=side_by_side(main, "compare-tokens"))


def token_figures(ckpt: CheckpointState, block: int, image: int, patch: int | None) -> list[go.Figure]:
    """Norms across depth (with the selected patch) and the patch norms after the block, outliers marked."""
    reason = block_message(ckpt, block)
    if reason:
        return [message_figure(reason)] * 2
    patch = patch_or_centre(ckpt, patch)
    return ckpt.cached(("token_figures", block, image, patch), lambda: build_token_figures(ckpt, block, image, patch))


def build_token_figures(ckpt: CheckpointState, block: int, image: int, patch: int) -> list[go.Figure]:
    """Norms across depth (with the patch) and the patch norms after the block, outliers marked."""
    norms = ckpt.token_norms()
    depth = block + 1
    across = figures.token_norm_figure(norms, patch=(image, patch), depth=depth)
    outliers = figures.patch_map_figure(
        norms.patch_maps[depth, image],
        ckpt.shown[image],
        patch_size=ckpt.patch_size,
        selected=patch,
        marked=norms.outlier_maps[depth, image],
        colorbar="L2 norm",
        title=f"image {image}: patch-token norms after block {block} (× above {float(norms.thresholds[depth]):.3g})",
    )
    return [across, outliers]


def register(app: dash.Dash, state: ExplorerState) -> None:
    """Token callbacks."""

    @app.callback(
        Output("token-norms", "figure"),
        Output("token-outliers", "figure"),
        Input("tabs", "value"),
        Input("checkpoint", "value"),
        Input("block", "value"),
        Input("image", "value"),
        Input("patch", "data"),
    )
    def tokens(tab_value: str, index: int, block: int, image: int, patch: int | None) -> list[go.Figure]:
        """Token norms and outliers of the image after the block."""
        require_tab(tab_value, TAB)
        return fill_panes(token_figures(state[index], block, image, patch))

    @app.callback(Output("compare-tokens", "children"), Input("tabs", "value"), Input("compare", "value"))
    def compare(tab_value: str, index: int | None) -> list:
        """The compared checkpoint's norms across depth."""
        require_tab(tab_value, TAB)
        return compare_panel(
            state, index, lambda c: [static_graph("compare-token-norms", figures.token_norm_figure(c.token_norms()))]
        )
