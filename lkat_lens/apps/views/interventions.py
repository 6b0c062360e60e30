"""Interventions: activation patching against a chosen corruption ([block × position] on the image grid and
[block × head]), a gate clamp or an edge ablation toggled with the top-5 predictions before and after, and the
sweeps (gate clamps per [block × head], the KAN prune curve, the symbolic-swap table of the block's fc1)."""

from __future__ import annotations

import dash
import plotly.graph_objects as go
from dash import Input, Output, dcc, html

from lkat_lens.analyses.interventions.corruptions import CORRUPTIONS
from lkat_lens.apps.state import CheckpointState, ExplorerState
from lkat_lens.figures import interventions as patching_figures_of
from lkat_lens.figures import interventions_gla_kan as intervention_figures

from .common import block_message, fill_panes, graph, head_of, message_figure, require_tab

TAB = "interventions"
CLAMPS = {"off": None, "α = 1 (never forget)": 1.0, "α = 0 (forget at once)": 0.0}
EDGE_RANKS = 5  # the block layer's most important edges offered for ablation
SWAP_EDGES = 5


def tab(state: ExplorerState) -> dcc.Tab:
    """The Interventions tab."""
    main = [
        html.Div(
            [
                html.Label("corruption", htmlFor="corruption"),
                dcc.Dropdown(
                    id="corruption",
                    options=list(CORRUPTIONS),
                    value=CORRUPTIONS[0],
                    clearable=False,
                    style={"width": "8em"},
                ),
            ],
            style={"display": "flex", "alignItems": "center", "gap": "0.5em"},
        ),
        graph("patching-grid"),
        graph("patching-positions"),
        graph("patching-heads"),
        html.H4("Toggle an intervention on the current image (the block and head selectors above pick where)"),
        html.Div(
            [
                html.Label("gate clamp"),
                dcc.RadioItems(id="clamp", options=list(CLAMPS), value="off", inline=True),
                html.Label("edge ablation"),
                dcc.RadioItems(id="ablate-layer", options=["off", "fc1", "fc2"], value="off", inline=True),
                html.Label("edge (importance rank)", htmlFor="ablate-rank"),
                dcc.Dropdown(
                    id="ablate-rank",
                    options=[{"label": str(r), "value": r} for r in range(EDGE_RANKS)],
                    value=0,
                    clearable=False,
                    style={"width": "5em"},
                ),
            ],
            style={"display": "flex", "alignItems": "center", "gap": "0.8em", "flexWrap": "wrap"},
        ),
        html.Div(id="intervened-predictions", style={"display": "flex", "gap": "3em", "fontFamily": "monospace"}),
        graph("clamp-sweep"),
        graph("prune-curve"),
        graph("swap-table"),
    ]
    return dcc.Tab(label="Interventions", value=TAB, children=html.Div(main))


def patching_figures(ckpt: CheckpointState, block: int, image: int, corruption: str) -> list[go.Figure]:
    """The block's residual patching over the image's patch grid, [block × position] and [block × head]."""
    reason = block_message(ckpt, block)
    if reason:
        return [message_figure(reason)] * 3
    try:
        positions = ckpt.patching(image, corruption, "resid_pre")
        heads = ckpt.patching(image, corruption, "heads")
    except ValueError as err:  # a model without the hook points patching needs
        return [message_figure(f"no patching: {err}")] * 3
    subject = f"image {image} vs {corruption}"
    return [
        ckpt.cached(
            ("patching_grid_figure", block, image, corruption),
            lambda: intervention_figures.patching_grid_figure(
                positions,
                block,
                ckpt.shown[image],
                ckpt.patch_size,
                title=f"block {block}: residual patched per patch ({subject}; 1 = clean restored)",
            ),
        ),
        patching_figures_of.patching_figure(positions, title=f"residual stream per [block × position] ({subject})"),
        patching_figures_of.patching_figure(heads, title=f"head outputs per [block × head] ({subject})"),
    ]


def topk_column(title: str, classes: list[tuple[str, float]], list_id: str) -> html.Div:
    """A heading and ranked class probabilities."""
    return html.Div([html.Strong(title), html.Ol([html.Li(f"{c}: {p:.3f}") for c, p in classes], id=list_id)])


def intervened_view(
    ckpt: CheckpointState, block: int, image: int, head: int, clamp: str, layer: str, rank: int
) -> list:
    """The top-5 predictions before and with the chosen gate clamp and edge ablation, or why one does not apply."""
    notes, gate, ablation = [], None, None
    alpha = CLAMPS.get(clamp)
    if alpha is not None:
        if block in ckpt.gla_blocks:
            gate = (block, head_of(ckpt, head), alpha)
        else:
            notes.append(f"no gate clamp: block {block} has no GLA forget gate")
    if layer in ("fc1", "fc2"):
        if layer in ckpt.block_layers(block):
            ablation = (block, layer, int(rank))
        else:
            notes.append(f"no edge ablation: block {block} has no KAN layer {layer}")
    what = []
    if gate is not None:
        what.append(f"block {block} head {gate[1]} α = {alpha:g}")
    if ablation is not None:
        q, p = ckpt.top_edge(block, layer, int(rank))
        what.append(f"block {block} {layer} φ[{q},{p}] ablated")
    after = ckpt.intervened_predictions(image, gate, ablation)
    return [
        topk_column(f"image {image} clean", ckpt.predictions(image), "topk-clean"),
        topk_column("with " + (" and ".join(what) or "no intervention"), after, "topk-intervened"),
        html.Div([html.P(n) for n in notes]),
    ]


def sweep_figures(ckpt: CheckpointState, block: int) -> list[go.Figure]:
    """Gate clamps per [block × head], the prune curve, and the symbolic swap of the block's fc1."""
    clamps = ckpt.gate_clamps()
    prune = ckpt.prune_curve()
    return [
        message_figure("no GLA forget gates to clamp")
        if clamps is None
        else ckpt.cached(("clamp_figure",), lambda: intervention_figures.gate_clamp_figure(clamps)),
        message_figure("no KAN layers to prune")
        if prune is None
        else ckpt.cached(("prune_figure",), lambda: intervention_figures.prune_curve_figure(prune)),
        message_figure(f"block {block} has no KAN layer fc1")
        if "fc1" not in ckpt.block_layers(block)
        else intervention_figures.symbolic_swap_figure(ckpt.symbolic_swap(block, "fc1", SWAP_EDGES)),
    ]


def register(app: dash.Dash, state: ExplorerState) -> None:
    """Interventions callbacks."""

    @app.callback(
        Output("patching-grid", "figure"),
        Output("patching-positions", "figure"),
        Output("patching-heads", "figure"),
        Input("tabs", "value"),
        Input("checkpoint", "value"),
        Input("block", "value"),
        Input("image", "value"),
        Input("corruption", "value"),
    )
    def patching(tab_value: str, index: int, block: int, image: int, corruption: str) -> list[go.Figure]:
        """The patching maps of the image against the corruption."""
        require_tab(tab_value, TAB)
        return fill_panes(patching_figures(state[index], block, image, corruption))

    @app.callback(
        Output("intervened-predictions", "children"),
        Input("tabs", "value"),
        Input("checkpoint", "value"),
        Input("block", "value"),
        Input("image", "value"),
        Input("head", "value"),
        Input("clamp", "value"),
        Input("ablate-layer", "value"),
        Input("ablate-rank", "value"),
    )
    def intervened(tab_value: str, index: int, block: int, image: int, head: int, clamp: str, layer: str, rank: int):
        """Top-5 predictions before and after the toggled intervention."""
        require_tab(tab_value, TAB)
        return intervened_view(state[index], block, image, head, clamp, layer, rank)

    @app.callback(
        Output("clamp-sweep", "figure"),
        Output("prune-curve", "figure"),
        Output("swap-table", "figure"),
        Input("tabs", "value"),
        Input("checkpoint", "value"),
        Input("block", "value"),
    )
    def sweeps(tab_value: str, index: int, block: int) -> list[go.Figure]:
        """The clamp sweep, prune curve and swap table."""
        require_tab(tab_value, TAB)
        return fill_panes(sweep_figures(state[index], block))
