"""Attributions of a dataset image or an uploaded one: method, class, overlay and deletion/insertion curves; with
object masks (shapes, --masks), the mask's outline on the image and the map's localisation and faithfulness scores."""

from __future__ import annotations

import base64

import dash
import plotly.graph_objects as go
from dash import Input, Output, State, dcc, html

from lkat_lens import figures
from lkat_lens.analyses.attributions import METHODS  # every method the library has, occlusion and SmoothGrad too
from lkat_lens.analyses.faithfulness import METRICS as MAP_METRICS
from lkat_lens.apps.state import MAX_UPLOAD_BYTES, BadUpload, CheckpointState, ExplorerState
from lkat_lens.figures.faithfulness import METRIC_LABELS, mask_outline

from .common import compare_panel, fill_panes, graph, message_figure, require_tab, side_by_side, static_graph

TAB = "attributions"
BROWSER_UPLOAD_CAP = 4 * MAX_UPLOAD_BYTES  # dcc.Upload drops larger files in the browser, without a message
PREDICTED = -1  # the class dropdown's "predicted class"


def tab(state: ExplorerState) -> dcc.Tab:
    """The Attributions tab."""
    classes = [{"label": "predicted class", "value": PREDICTED}]
    classes += [{"label": f"{i}: {name}", "value": i} for i, name in enumerate(state[0].class_names)]
    choices = html.Div(
        [
            dcc.Dropdown(
                id="method", options=list(METHODS), value=METHODS[0], clearable=False, style={"width": "20em"}
            ),
            html.Label("class", htmlFor="target"),
            dcc.Dropdown(id="target", options=classes, value=PREDICTED, clearable=False, style={"width": "14em"}),
        ],
        style={"display": "flex", "alignItems": "center", "gap": "1em"},
    )
    upload = dcc.Upload(
        id="upload",
        children=html.Div(
            ["Drop an image here or ", html.A("choose a file"), f" (PNG/JPEG, at most {MAX_UPLOAD_BYTES // 2**20} MiB)"]
        ),
        max_size=BROWSER_UPLOAD_CAP,
        multiple=False,
        style={"border": "1px dashed #888", "padding": "1em", "margin": "0.5em 0", "textAlign": "center"},
    )
    main = [
        choices,
        upload,
        html.Div(id="upload-message", role="alert", style={"color": "#b00020"}),
        graph("attribution-figure"),
        html.Div(id="attribution-scores"),
        graph("attribution-curves"),
    ]
    return dcc.Tab(label="Attributions", value=TAB, children=side_by_side(main, "compare-attributions"))


def decode_upload(contents: str) -> bytes:
    """The bytes of a dcc.Upload data URL; BadUpload if it is not one."""
    _, _, payload = contents.partition(",")
    try:
        return base64.b64decode(payload, validate=True)
    except ValueError:
        raise BadUpload("the upload is not base64 data") from None


def class_of(target: int | None) -> int | None:
    """The dropdown's class as an attribution target (None: the predicted class)."""
    return None if target is None or target == PREDICTED else int(target)


def title(ckpt: CheckpointState, method: str, target: int | None, of: str) -> str:
    """What an attribution figure shows: method, class and image."""
    chosen = "the predicted class" if target is None else f"class {ckpt.class_name(target)}"
    return f"{method} attribution of {chosen}<br>in {of}"


def dataset_figures(ckpt: CheckpointState, image: int, method: str, target: int | None) -> list[go.Figure]:
    """Overlay and deletion/insertion curves of a sample image's attribution."""
    found = ckpt.attribution(image, method, target)
    of = f"image {image}"
    overlay = figures.attribution_figure(
        found,
        ckpt.shown[image : image + 1],
        title=title(ckpt, method, target, of),
        names=[of],
        class_names=ckpt.class_names,
    )
    if ckpt.sample.masks is not None:
        for row in (1, 2):
            overlay.add_trace(mask_outline(ckpt.sample.masks[image]), row=row, col=1)
    return [overlay, figures.faithfulness_figure(ckpt.faithfulness(image, method, target))]


def score_table(ckpt: CheckpointState, image: int, method: str, target: int | None) -> html.Div | str:
    """The sample image's map scores against its object mask (analyses.faithfulness), or "" without masks."""
    if ckpt.sample.masks is None:
        return ""
    scores = ckpt.map_scores(image, method, target)
    cells = [html.Tr([html.Th(METRIC_LABELS[m]), html.Td(f"{scores[m]:.3f}")]) for m in MAP_METRICS if m in scores]
    caption = f"{method} on image {image} against its object mask (green outline); ↑ higher is better, ↓ lower"
    return html.Div([html.Small(caption), html.Table(cells, className="map-scores")])


def upload_figures(ckpt: CheckpointState, content: bytes, name: str, method: str, target: int | None):
    """Overlay, curves and conversion notes of an uploaded image's attribution; BadUpload if it is no usable image."""
    loaded = ckpt.upload(content, name)
    images = loaded.tensor.unsqueeze(0)
    found = ckpt.attribute(images, method, target)
    overlay = figures.attribution_figure(
        found, ckpt.display(images), title=title(ckpt, method, target, name), names=[name], class_names=ckpt.class_names
    )
    notes = html.Span(f"{name}: {'; '.join(loaded.notes)}", style={"color": "#555"}) if loaded.notes else ""
    return [overlay, figures.faithfulness_figure(ckpt.faithfulness_of(images, found)), notes]


def shown_figures(
    ckpt: CheckpointState, image: int, upload: str | None, filename: str | None, method: str, target: int | None
) -> list:
    """Overlay, curves and message of what the page shows: the upload while there is one (an unreadable one:
    figures that say why, so no earlier upload stays on screen), else the sample image."""
    if not upload:
        return [*dataset_figures(ckpt, image, method, target), ""]
    name = filename or "the upload"
    try:
        return upload_figures(ckpt, decode_upload(upload), name, method, target)
    except BadUpload as err:
        return [message_figure(f"no attribution: {name} is not a usable image"), message_figure(""), str(err)]


def register(app: dash.Dash, state: ExplorerState) -> None:
    """Attribution callbacks."""

    @app.callback(
        Output("upload", "contents"),
        Output("upload", "filename"),
        Input("image", "value"),
        prevent_initial_call=True,
    )
    def drop_upload(_image: int) -> tuple[None, None]:
        """Choosing a sample image drops the upload: figures, predictions and the compare column follow."""
        return None, None

    @app.callback(
        Output("attribution-figure", "figure"),
        Output("attribution-curves", "figure"),
        Output("upload-message", "children"),
        Output("attribution-scores", "children"),
        Input("tabs", "value"),
        Input("checkpoint", "value"),
        Input("image", "value"),
        Input("method", "value"),
        Input("target", "value"),
        Input("upload", "contents"),
        State("upload", "filename"),
    )
    def attribution(tab_value, index, image, method, target, upload, filename):
        """The upload's attribution while there is one, else the sample image's."""
        require_tab(tab_value, TAB)
        ckpt, chosen = state[index], class_of(target)
        overlay, curves, message = shown_figures(ckpt, image, upload, filename, method, chosen)
        scores = "" if upload else score_table(ckpt, image, method, chosen)
        return *fill_panes([overlay, curves]), message, scores

    @app.callback(
        Output("compare-attributions", "children"),
        Input("tabs", "value"),
        Input("compare", "value"),
        Input("image", "value"),
        Input("method", "value"),
        Input("target", "value"),
        Input("upload", "contents"),
        State("upload", "filename"),
    )
    def compare(tab_value, index, image, method, target, upload, filename):
        """The same image's attribution (the upload, or the sample image) in the compared checkpoint."""
        require_tab(tab_value, TAB)

        def panels(ckpt: CheckpointState) -> list:
            if not upload and image >= len(ckpt.sample.labels):
                return [static_graph("compare-attribution-figure", message_figure(f"no image {image} in its sample"))]
            overlay, curves, _ = shown_figures(ckpt, image, upload, filename, method, class_of(target))
            return [
                static_graph("compare-attribution-figure", overlay),
                static_graph("compare-attribution-curves", curves),
            ]

        return compare_panel(state, index, panels)
