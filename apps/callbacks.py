"""Every callback of the explorer: the shared selection, the page-wide readouts and each view's own."""

from __future__ import annotations

import dash
from dash import Input, Output, html
from lkat_lens.apps import selection
from lkat_lens.apps.state import CheckpointState, ExplorerState
from lkat_lens.apps.views import VIEWS
from lkat_lens.apps.views.common import patch_or_centre


def predictions_view(ckpt: CheckpointState, image: int) -> list:
    """The top-k predictions of the current image, with its label."""
    name = ckpt.class_name(int(ckpt.sample.labels[image]))
    items = [html.Li(f"{cls}: {prob:.3f}") for cls, prob in ckpt.predictions(image)]
    return [html.Strong(f"image {image} (label {name}) top-{len(items)} predictions"), html.Ol(items, id="topk")]


def patch_text(ckpt: CheckpointState, patch: int | None) -> str:
    """The selected patch as text (row, column on the patch grid)."""
    index = patch_or_centre(ckpt, patch)
    row, col = divmod(index, ckpt.grid_size[1])
    return f"patch {index} (row {row}, col {col}){'' if patch is not None else ', centre'}"


def register(app: dash.Dash, state: ExplorerState) -> None:
    """Attach every callback of the explorer to app."""
    selection.register(app, state)

    @app.callback(Output("predictions", "children"), Input("checkpoint", "value"), Input("image", "value"))
    def predictions(index: int, image: int) -> list:
        """Top-k predictions for the current image."""
        return predictions_view(state[index], image)

    @app.callback(Output("patch-label", "children"), Input("checkpoint", "value"), Input("patch", "data"))
    def patch_label(index: int, patch: int | None) -> str:
        """Which patch the patch views follow."""
        return patch_text(state[index], patch)

    for view in VIEWS:
        view.register(app, state)
