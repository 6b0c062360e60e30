"""The explorer's shared selection: kept in the URL (a link reopens the same view), moved by buttons, keys and clicks.

The URL names the checkpoint and the one compared with, the tab, the block, image, head and patch, and on
the Edge functions tab the layer and the clicked edge; values at their defaults are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs, urlencode

import dash
from dash import Input, Output, State, ctx

from lkat_lens.apps.views.edges import LAYERS, clicked_edge

from .state import ExplorerState
from .views import VIEWS

HEAD_GRAPHS = ("gate-heads", "gate-half-life")  # a click picks a head (gate-heads: and its block)
PATCH_GRAPHS = ("cls-attention", "patch-attention", "token-outliers", "rollout")  # a click picks a patch
EDGE_GRAPH = "edge-importance"  # a click picks an edge of the block's layer
TABS = tuple(view.TAB for view in VIEWS)


@dataclass(frozen=True)
class Limits:
    """How many blocks, images, heads, patches and checkpoints the selection ranges over."""

    blocks: int
    images: int
    heads: int
    patches: int
    checkpoints: int = 1


@dataclass(frozen=True)
class Selection:
    """What the page shows: a block, a sample image, a head, optionally a patch (None: the centre one), the
    checkpoint and the one compared with, the tab, and the KAN layer and edge (q, p) of the Edge functions tab
    (None: the layer's most important edge)."""

    block: int = 0
    image: int = 0
    head: int = 0
    patch: int | None = None
    checkpoint: int = 0
    compare: int | None = None
    tab: str = TABS[0]
    layer: str = LAYERS[0]
    edge: tuple[int, int] | None = None

    def query(self) -> str:
        """The selection as a URL query string (?block=..&image=..&head=..[&patch=..&checkpoint=..&...])."""
        fields: dict[str, Any] = {"block": self.block, "image": self.image, "head": self.head, "patch": self.patch}
        if self.checkpoint:
            fields["checkpoint"] = self.checkpoint
        fields["compare"] = self.compare
        if self.tab != TABS[0]:
            fields["tab"] = self.tab
        if self.layer != LAYERS[0]:
            fields["layer"] = self.layer
        fields["edge"] = None if self.edge is None else f"{self.edge[0]}.{self.edge[1]}"
        return "?" + urlencode({key: value for key, value in fields.items() if value is not None})

    def values(self) -> tuple:
        """The selection as the page holds it: block, image, head, patch, checkpoint and compare selectors, tab,
        layer, edge store and URL query."""
        return (
            self.block,
            self.image,
            self.head,
            self.patch,
            self.checkpoint,
            self.compare,
            self.tab,
            self.layer,
            self.edge_data(),
            self.query(),
        )

    def edge_data(self) -> dict[str, Any] | None:
        """The chosen edge for the Edge functions view, tied to its block and layer."""
        if self.edge is None:
            return None
        return {"block": self.block, "layer": self.layer, "q": self.edge[0], "p": self.edge[1]}


def _index(values: dict[str, list[str]], key: str, limit: int) -> int | None:
    """A non-negative index below limit named in a parsed query, or None."""
    found = values.get(key, [""])[0]
    return int(found) if found.isdigit() and int(found) < limit else None


def _choice(values: dict[str, list[str]], key: str, choices: tuple[str, ...]) -> str:
    """One of choices named in a parsed query, else the first."""
    found = values.get(key, [""])[0]
    return found if found in choices else choices[0]


def _edge(values: dict[str, list[str]]) -> tuple[int, int] | None:
    """An edge "q.p" named in a parsed query (its range is checked against the layer by the view), or None."""
    q, dot, p = values.get("edge", [""])[0].partition(".")
    return (int(q), int(p)) if dot and q.isdigit() and p.isdigit() else None


def parse_query(search: str | None, limits: Limits) -> Selection:
    """The selection a URL query names; missing or out-of-range values fall back to the defaults."""
    values = parse_qs((search or "").lstrip("?"))
    return Selection(
        block=_index(values, "block", limits.blocks) or 0,
        image=_index(values, "image", limits.images) or 0,
        head=_index(values, "head", limits.heads) or 0,
        patch=_index(values, "patch", limits.patches),
        checkpoint=_index(values, "checkpoint", limits.checkpoints) or 0,
        compare=_index(values, "compare", limits.checkpoints),
        tab=_choice(values, "tab", TABS),
        layer=_choice(values, "layer", LAYERS),
        edge=_edge(values),
    )


def step_block(block: int, step: int, num_blocks: int) -> int:
    """The neighbouring block (wrapping around)."""
    return (block + step) % num_blocks


def clicked_patch(point: dict[str, Any], patch_size: tuple[int, int], grid: tuple[int, int]) -> int | None:
    """The patch under a click on an image figure (x, y in pixels), or None outside the image."""
    row, col = int(round(point["y"])) // patch_size[0], int(round(point["x"])) // patch_size[1]
    return row * grid[1] + col if 0 <= row < grid[0] and 0 <= col < grid[1] else None


def apply_click(
    current: Selection, graph: str, click: dict[str, Any], patch_size: tuple[int, int], grid: tuple[int, int]
) -> Selection:
    """The selection after a click on one of the head or patch graphs."""
    point = click["points"][0]
    if graph == "gate-heads":  # x: head, y: block
        return replace(current, head=int(point["x"]), block=int(point["y"]))
    if graph == "gate-half-life":  # one heatmap per head, in head order
        return replace(current, head=int(point["curveNumber"]))
    patch = clicked_patch(point, patch_size, grid)
    return current if patch is None else replace(current, patch=patch)


def keep_edge(current: Selection, before: Selection) -> Selection:
    """current with the edge chosen before, if it still names the same checkpoint, block and layer."""
    same = (current.checkpoint, current.block, current.layer) == (before.checkpoint, before.block, before.layer)
    return replace(current, edge=before.edge if same else None)


def changed(shown: tuple, wanted: tuple) -> tuple:
    """wanted, with dash.no_update where the page already shows that value."""
    return tuple(dash.no_update if old == new else new for old, new in zip(shown, wanted, strict=True))


def register(app: dash.Dash, state: ExplorerState) -> None:
    """The callback that keeps selectors, tab, URL and clicks in step."""
    limits = Limits(state.num_blocks, state.num_images, state.num_heads, state.num_patches, len(state.paths))
    graphs = HEAD_GRAPHS + PATCH_GRAPHS

    @app.callback(
        Output("block", "value"),
        Output("image", "value"),
        Output("head", "value"),
        Output("patch", "data"),
        Output("checkpoint", "value"),
        Output("compare", "value"),
        Output("tabs", "value"),
        Output("edge-layer", "value"),
        Output("edge", "data"),
        Output("url", "search"),
        Input("url", "search"),
        Input("prev-block", "n_clicks"),
        Input("next-block", "n_clicks"),
        Input("block", "value"),
        Input("image", "value"),
        Input("head", "value"),
        Input("checkpoint", "value"),
        Input("compare", "value"),
        Input("tabs", "value"),
        Input("edge-layer", "value"),
        Input(EDGE_GRAPH, "clickData"),
        *(Input(graph, "clickData") for graph in graphs),
        State("patch", "data"),
        State("edge", "data"),
    )
    def sync(search: str | None, _prev: int, _next: int, *rest: Any):
        """Read the URL on load and on navigation; otherwise apply the event and write the URL. Only what
        changed is sent back (a value sent again would fire its views a second time, e.g. drop an upload)."""
        block, image, head, index, compare, tab, layer, edge_click, *clicks, patch, edge = rest
        trigger = ctx.triggered_id
        before = parse_query(search, limits)
        if trigger in (None, "url"):
            current = before
        else:
            current = Selection(
                int(block or 0), int(image or 0), int(head or 0), patch, int(index or 0), compare,
                tab=tab or TABS[0], layer=layer or LAYERS[0],
            )  # fmt: skip
            ckpt = state[current.checkpoint]
            if trigger in ("prev-block", "next-block"):
                step = -1 if trigger == "prev-block" else 1
                current = replace(current, block=step_block(current.block, step, limits.blocks))
            elif trigger in graphs and clicks[graphs.index(trigger)]:
                click = clicks[graphs.index(trigger)]
                current = apply_click(current, trigger, click, ckpt.patch_size, ckpt.grid_size)
            if trigger == EDGE_GRAPH and edge_click:
                current = replace(
                    current, edge=clicked_edge(ckpt, current.block, current.layer, edge_click["points"][0])
                )
            else:
                current = keep_edge(current, before)
        shown = (block, image, head, patch, index, compare, tab, layer, edge, search)
        return changed(shown, current.values())
