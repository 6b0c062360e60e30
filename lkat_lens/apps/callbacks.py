"""Every callback of the explorer: the shared selection, the page-wide readouts and each view's own."""

from __future__ import annotations

import dash
from dash import Input, Output, State, html

from lkat_lens.apps.views.attributions import decode_upload
from lkat_lens.apps.views.common import patch_or_centre

from . import selection
from .state import BadUpload, CheckpointState, ExplorerState
from .views import VIEWS


def predictions_view(ckpt: CheckpointState, image: int) -> list:
    """The top-k predictions of the current image, with its label."""
    label = int(ckpt.sample.labels[image])
    subject = f"image {image} (label {ckpt.class_name(label)})" if label >= 0 else f"image {image} (no label)"
    return topk_list(subject, ckpt.predictions(image))


def upload_predictions_view(ckpt: CheckpointState, contents: str, filename: str | None) -> list:
    """The top-k predictions of an uploaded image (unreadable uploads: the attribution view says why)."""
    name = filename or "the upload"
    try:
        images = ckpt.upload(decode_upload(contents), name).tensor.unsqueeze(0)
    except BadUpload:
        return [html.Strong(f"{name}: no predictions (not a usable image)")]
    return topk_list(f"uploaded {name}", ckpt.top_k(images, 5))


def topk_list(subject: str, classes: list[tuple[str, float]]) -> list:
    """A heading and the ranked class probabilities."""
    items = [html.Li(f"{cls}: {prob:.3f}") for cls, prob in classes]
    return [html.Strong(f"{subject} top-{len(items)} predictions"), html.Ol(items, id="topk")]


def patch_text(ckpt: CheckpointState, patch: int | None) -> str:
    """The selected patch as text (row, column on the patch grid)."""
    index = patch_or_centre(ckpt, patch)
    row, col = divmod(index, ckpt.grid_size[1])
    return f"patch {index} (row {row}, col {col}){'' if patch is not None else ', centre'}"


def register(app: dash.Dash, state: ExplorerState) -> None:
    """Attach every callback of the explorer to app."""
    selection.register(app, state)

    @app.callback(
        Output("predictions", "children"),
        Input("checkpoint", "value"),
        Input("image", "value"),
        Input("upload", "contents"),
        State("upload", "filename"),
    )
    def predictions(index: int, image: int, contents: str | None, filename: str | None) -> list:
        """Top-k predictions for the current image: the uploaded one until a dataset image is picked again."""
        if contents:
            return upload_predictions_view(state[index], contents, filename)
        return predictions_view(state[index], image)

    @app.callback(Output("patch-label", "children"), Input("checkpoint", "value"), Input("patch", "data"))
    def patch_label(index: int, patch: int | None) -> str:
        """Which patch the patch views follow."""
        return patch_text(state[index], patch)

    for view in VIEWS:
        view.register(app, state)
