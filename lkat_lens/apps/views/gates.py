"""Gates & attention: forget-gate half-lives (spatial, per head, per channel), attention maps and rollout."""

from __future__ import annotations

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
    head_of,
    message_figure,
    patch_or_centre,
    require_tab,
    side_by_side,
    static_graph,
)

TAB = "gates"
ROLLOUT_METHODS = ("attention", "gradient")


def tab(state: ExplorerState) -> dcc.Tab:
    """The Gates & attention tab."""
    main = [
        html.P("Click a head in a gate map to select it; click a patch on an image to select that patch."),
        graph("gate-half-life"),
        graph("gate-heads"),
        graph("gate-channels"),
        graph("cls-attention"),
        graph("patch-attention"),
        dcc.RadioItems(id="rollout-method", options=list(ROLLOUT_METHODS), value=ROLLOUT_METHODS[0], inline=True),
        graph("rollout"),
    ]
    return dcc.Tab(label="Gates & attention", value=TAB, children=side_by_side(main, "compare-gates"))


def gate_figures(ckpt: CheckpointState, block: int, head: int) -> list[go.Figure]:
    """The block's half-life map per head, half-lives of every block and head, and the head's channels."""
    reason = block_message(ckpt, block)
    if not ckpt.has_gates or reason:
        text = reason or f"not applicable: {ckpt.info.model_name} has no GLA forget gates"
        return [message_figure(text)] * 3
    head = head_of(ckpt, head)
    return ckpt.cached(("gate_figures", block, head), lambda: build_gate_figures(ckpt, block, head))


def build_gate_figures(ckpt: CheckpointState, block: int, head: int) -> list[go.Figure]:
    """The gate figures of a GLA block and head."""
    all_gates = ckpt.gate_statistics()
    if block not in all_gates.blocks:
        return [message_figure(f"block {block} has no GLA gate")] * 3
    spatial = figures.gate_half_life_figure(
        ckpt.block_gates(block), title=f"block {block}: forget-gate half-life per patch (tokens); click a head"
    )
    return [spatial, figures.gate_head_figure(all_gates), figures.gate_channel_figure(all_gates, block, head)]


def attention_figures(ckpt: CheckpointState, block: int, image: int, head: int, patch: int | None) -> list[go.Figure]:
    """The class token's and the selected patch's attention in a block, for one head and image."""
    reason = block_message(ckpt, block)
    if reason:
        return [message_figure(reason)] * 2
    head, patch = head_of(ckpt, head), patch_or_centre(ckpt, patch)
    found = ckpt.attention(block, image)
    kind = "implicit attention" if found.kinds[0] == "gla" else "attention"
    cls = ckpt.cached(
        ("cls_figure", block, image, head),
        lambda: figures.cls_attention_figure(
            ckpt.cls_attention(block, image),
            ckpt.shown[image : image + 1],
            patch_size=ckpt.patch_size,
            head=head,
            names=[f"image {image}"],
            title=f"block {block} head {head}: CLS {kind}",
        ),
    )
    row = ckpt.cached(
        ("patch_row_figure", block, image, head, patch),
        lambda: figures.patch_map_figure(
            ckpt.patch_attention(block, image, patch)[head],
            ckpt.shown[image],
            patch_size=ckpt.patch_size,
            selected=patch,
            signed=True,
            colorbar="weight",
            title=f"block {block} head {head}: what patch {patch} reads ({kind} row)",
        ),
    )
    return [cls, row]


def rollout_figure(ckpt: CheckpointState, image: int, method: str, patch: int | None) -> go.Figure:
    """The class token's attention rollout through every block, over the image."""
    found = ckpt.rollout(image, method)
    return figures.patch_map_figure(
        found.cls_map[0],
        ckpt.shown[image],
        patch_size=ckpt.patch_size,
        selected=patch_or_centre(ckpt, patch),
        colorbar="relevance",
        title=f"{method} rollout: what the class token reads after all blocks",
    )


def register(app: dash.Dash, state: ExplorerState) -> None:
    """Gate and attention callbacks."""

    @app.callback(
        Output("gate-half-life", "figure"),
        Output("gate-heads", "figure"),
        Output("gate-channels", "figure"),
        Input("tabs", "value"),
        Input("checkpoint", "value"),
        Input("block", "value"),
        Input("head", "value"),
    )
    def gates(tab_value: str, index: int, block: int, head: int) -> list[go.Figure]:
        """Gate views of the block and head."""
        require_tab(tab_value, TAB)
        return fill_panes(gate_figures(state[index], block, head))

    @app.callback(
        Output("cls-attention", "figure"),
        Output("patch-attention", "figure"),
        Input("tabs", "value"),
        Input("checkpoint", "value"),
        Input("block", "value"),
        Input("image", "value"),
        Input("head", "value"),
        Input("patch", "data"),
    )
    def attention(tab_value: str, index: int, block: int, image: int, head: int, patch: int | None):
        """Class-token and patch attention of the block."""
        require_tab(tab_value, TAB)
        return fill_panes(attention_figures(state[index], block, image, head, patch))

    @app.callback(
        Output("rollout", "figure"),
        Input("tabs", "value"),
        Input("checkpoint", "value"),
        Input("image", "value"),
        Input("rollout-method", "value"),
        Input("patch", "data"),
    )
    def rollout(tab_value: str, index: int, image: int, method: str, patch: int | None) -> go.Figure:
        """Attention rollout of the image."""
        require_tab(tab_value, TAB)
        return fill_pane(rollout_figure(state[index], image, method, patch))

    @app.callback(
        Output("compare-gates", "children"),
        Input("tabs", "value"),
        Input("compare", "value"),
        Input("block", "value"),
    )
    def compare(tab_value: str, index: int | None, block: int) -> list:
        """The compared checkpoint's gate map of the same block."""
        require_tab(tab_value, TAB)
        return compare_panel(
            state, index, lambda c: [static_graph("compare-gate-half-life", gate_figures(c, block, 0)[0])]
        )
