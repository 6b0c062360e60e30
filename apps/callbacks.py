"""Callbacks of the explorer: URL/block state and one figure callback per view."""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import parse_qs, urlencode

import dash
import plotly.graph_objects as go
from dash import Input, Output, State, ctx, html
from lkat_lens.apps.state import BadUpload, CheckpointState, ExplorerState, attribute, model_card
from plotly.subplots import make_subplots

from lkat_lens import figures


def block_from_search(search: str | None, num_blocks: int) -> int | None:
    """The block named in a URL query string (?block=N), or None when absent or out of range."""
    values = parse_qs((search or "").lstrip("?")).get("block", [])
    if not values or not values[0].isdigit():
        return None
    block = int(values[0])
    return block if block < num_blocks else None


def step_block(block: int, step: int, num_blocks: int) -> int:
    """The neighbouring block (wrapping around)."""
    return (block + step) % num_blocks


def training_curve_figure(metrics: list[dict[str, Any]], title: str = "") -> go.Figure:
    """Per-epoch losses (left) and top-k accuracies (right) of a checkpoint's metrics."""
    epochs = [m.get("epoch", i + 1) for i, m in enumerate(metrics)]
    keys = sorted({k for m in metrics for k in m})
    panels = {1: [k for k in keys if k.endswith("loss")], 2: [k for k in keys if "top" in k]}
    fig = make_subplots(rows=1, cols=2, subplot_titles=["loss", "accuracy (%)"])
    for col, names in panels.items():
        for k in names:
            ys = [m.get(k) for m in metrics]
            fig.add_trace(go.Scatter(x=epochs, y=ys, mode="lines+markers", name=k), row=1, col=col)
        fig.update_xaxes(title_text="epoch", row=1, col=col)
    fig.update_layout(title=title or "training curves", height=380)
    return fig


def importance_figure(edge_std, title: str) -> go.Figure:
    """A heatmap of a layer's edge importance [out, in]."""
    fig = go.Figure(go.Heatmap(z=edge_std.double().tolist(), colorscale="Viridis", colorbar={"title": "std"}))
    fig.update_layout(title=title, xaxis_title="input channel", yaxis_title="output node", height=420)
    return fig


def message_figure(text: str) -> go.Figure:
    """An empty figure that says why there is nothing to draw."""
    fig = go.Figure()
    fig.add_annotation(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(xaxis_visible=False, yaxis_visible=False, height=200)
    return fig


def edge_figures(ckpt: CheckpointState, block: int) -> list[go.Figure]:
    """fc1 and fc2 top-k curves of a block and the fc1 importance heatmap (built once per block)."""
    return ckpt.cached(("edge_figures", block), lambda: build_edge_figures(ckpt, block))


def build_edge_figures(ckpt: CheckpointState, block: int) -> list[go.Figure]:
    """fc1 and fc2 top-k curves of a block and the fc1 importance heatmap."""
    layers = ckpt.block_layers(block)
    figs = []
    for short in ("fc1", "fc2"):
        if short not in layers:
            figs.append(message_figure(f"block {block} has no KAN {short}"))
            continue
        curves, scores, stats = ckpt.edge_curves(block, short)
        title = f"block {block} {short}: top {len(scores)} edge functions by std over real inputs"
        figs.append(figures.edge_curve_figure(curves, stats.coverage, scores=scores, title=title))
    if "fc1" in layers:
        importance = ckpt.edge_importance(block, "fc1")
        figs.append(importance_figure(importance.edge_std, f"block {block} fc1: edge importance"))
    else:
        figs.append(message_figure(f"block {block} has no KAN fc1"))
    return figs


def gate_figures(ckpt: CheckpointState, block: int, image: int) -> list[go.Figure]:
    """Gate and class-token views of a block and image (built once per block and image)."""
    return ckpt.cached(("gate_figures", block, image), lambda: build_gate_figures(ckpt, block, image))


def build_gate_figures(ckpt: CheckpointState, block: int, image: int) -> list[go.Figure]:
    """The block's gate half-life map, the half-lives of every block and head, and the block's class-token map."""
    block_gates = ckpt.block_gates(block)
    all_gates = ckpt.gate_statistics()
    half_life = (
        figures.gate_half_life_figure(block_gates, title=f"block {block}: forget-gate half-life per patch (tokens)")
        if block_gates is not None
        else message_figure(f"block {block} has no GLA gate")
    )
    heads = figures.gate_head_figure(all_gates) if all_gates is not None else message_figure("no GLA blocks")
    cls = figures.cls_attention_figure(
        ckpt.cls_attention(block, image),
        ckpt.shown[image : image + 1],
        patch_size=ckpt.patch_size(),
        title=f"block {block}: CLS attention",
    )
    return [half_life, heads, cls]


def predictions_view(ckpt: CheckpointState, image: int) -> list:
    """The top-k predictions of the current image, with its label."""
    label = int(ckpt.sample.labels[image])
    name = ckpt.class_names[label] if label < len(ckpt.class_names) else str(label)
    items = [html.Li(f"{cls}: {prob:.3f}") for cls, prob in ckpt.predictions(image)]
    return [html.Strong(f"image {image} (label {name}) top-{len(items)} predictions"), html.Ol(items, id="topk")]


def register(app: dash.Dash, state: ExplorerState) -> None:
    """Attach every callback of the explorer to app."""

    @app.callback(
        Output("block", "value"),
        Output("url", "search"),
        Input("url", "search"),
        Input("prev-block", "n_clicks"),
        Input("next-block", "n_clicks"),
        Input("block", "value"),
    )
    def sync_block(search: str | None, _prev: int, _next: int, block: int | None) -> tuple[int, str]:
        """Keep the block selector and the URL's ?block= in step; prev/next move it."""
        n = state.num_blocks
        trigger = ctx.triggered_id
        if trigger == "prev-block":
            block = step_block(block or 0, -1, n)
        elif trigger == "next-block":
            block = step_block(block or 0, 1, n)
        elif trigger in (None, "url"):
            from_url = block_from_search(search, n)
            block = from_url if from_url is not None else (block or 0)
        block = int(block or 0)
        return block, "?" + urlencode({"block": block})

    @app.callback(Output("model-card", "children"), Output("training-curves", "figure"), Input("checkpoint", "value"))
    def overview(index: int) -> tuple[str, go.Figure]:
        """The model card and training curves of a checkpoint."""
        ckpt = state[index]
        card = json.dumps(model_card(ckpt.info, ckpt.num_parameters), indent=2, default=str)
        return card, training_curve_figure(ckpt.info.metrics, f"training curves of {ckpt.path.name}")

    @app.callback(Output("predictions", "children"), Input("checkpoint", "value"), Input("image", "value"))
    def predictions(index: int, image: int) -> list:
        """Top-k predictions for the current image."""
        return predictions_view(state[index], image)

    @app.callback(
        Output("fc1-curves", "figure"),
        Output("fc2-curves", "figure"),
        Output("edge-importance", "figure"),
        Input("checkpoint", "value"),
        Input("block", "value"),
    )
    def edges(index: int, block: int) -> list[go.Figure]:
        """Edge-function views of the block."""
        ckpt = state[index]
        return edge_figures(ckpt, min(block, ckpt.num_blocks - 1))

    @app.callback(
        Output("gate-half-life", "figure"),
        Output("gate-heads", "figure"),
        Output("cls-attention", "figure"),
        Input("checkpoint", "value"),
        Input("block", "value"),
        Input("image", "value"),
    )
    def gates(index: int, block: int, image: int) -> list[go.Figure]:
        """Gate and class-token attention views of the block."""
        ckpt = state[index]
        return gate_figures(ckpt, min(block, ckpt.num_blocks - 1), image)

    @app.callback(Output("token-norms", "figure"), Input("checkpoint", "value"))
    def token_norms(index: int) -> go.Figure:
        """Token norms across depth."""
        return figures.token_norm_figure(state[index].token_norms())

    @app.callback(
        Output("attribution-figure", "figure"),
        Output("upload-message", "children"),
        Input("checkpoint", "value"),
        Input("image", "value"),
        Input("method", "value"),
        Input("upload", "contents"),
        State("upload", "filename"),
    )
    def attribution(index: int, image: int, method: str, contents: str | None, filename: str | None):
        """The attribution overlay of the current image, or of an uploaded one (an error message if unreadable)."""
        ckpt = state[index]
        if contents and ctx.triggered_id != "image":
            try:
                images = ckpt.upload(decode_upload(contents))
            except BadUpload as err:
                return dash.no_update, f"{filename or 'upload'}: {err}"
            result = attribute(ckpt.model, images, method)
            title = f"{method} attribution of {filename or 'the upload'}"
            return figures.attribution_figure(result, ckpt.display(images), title=title), ""
        result = ckpt.attribution(image, method)
        return figures.attribution_figure(result, ckpt.shown[image : image + 1]), ""


def decode_upload(contents: str) -> bytes:
    """The bytes of a dcc.Upload data URL; BadUpload if it is not one."""
    _, _, payload = contents.partition(",")
    try:
        return base64.b64decode(payload, validate=True)
    except ValueError:
        raise BadUpload("the upload is not base64 data") from None
