"""The explorer's shared selection (block, image, head, patch): kept in the URL, moved by buttons, keys and clicks."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs, urlencode

import dash
from dash import Input, Output, State, ctx
from lkat_lens.apps.state import ExplorerState

HEAD_GRAPHS = ("gate-heads", "gate-half-life")  # a click picks a head (gate-heads: and its block)
PATCH_GRAPHS = ("cls-attention", "patch-attention", "token-outliers", "rollout")  # a click picks a patch


@dataclass(frozen=True)
class Limits:
    """How many blocks, images, heads and patches the selection ranges over."""

    blocks: int
    images: int
    heads: int
    patches: int


@dataclass(frozen=True)
class Selection:
    """What every view shows: a block, a sample image, a head and optionally a patch (None: the centre one)."""

    block: int = 0
    image: int = 0
    head: int = 0
    patch: int | None = None

    def query(self) -> str:
        """The selection as a URL query string (?block=..&image=..&head=..[&patch=..])."""
        fields = {"block": self.block, "image": self.image, "head": self.head}
        if self.patch is not None:
            fields["patch"] = self.patch
        return "?" + urlencode(fields)


def _index(values: dict[str, list[str]], key: str, limit: int) -> int | None:
    """A non-negative index below limit named in a parsed query, or None."""
    found = values.get(key, [""])[0]
    return int(found) if found.isdigit() and int(found) < limit else None


def parse_query(search: str | None, limits: Limits) -> Selection:
    """The selection a URL query names; missing or out-of-range values fall back to the defaults."""
    values = parse_qs((search or "").lstrip("?"))
    return Selection(
        block=_index(values, "block", limits.blocks) or 0,
        image=_index(values, "image", limits.images) or 0,
        head=_index(values, "head", limits.heads) or 0,
        patch=_index(values, "patch", limits.patches),
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
    """The selection after a click on one of the linked graphs."""
    point = click["points"][0]
    if graph == "gate-heads":  # x: head, y: block
        return replace(current, head=int(point["x"]), block=int(point["y"]))
    if graph == "gate-half-life":  # one heatmap per head, in head order
        return replace(current, head=int(point["curveNumber"]))
    patch = clicked_patch(point, patch_size, grid)
    return current if patch is None else replace(current, patch=patch)


def register(app: dash.Dash, state: ExplorerState) -> None:
    """The callback that keeps selectors, URL and clicks in step."""
    limits = Limits(state.num_blocks, state.num_images, state.num_heads, state.num_patches)
    graphs = HEAD_GRAPHS + PATCH_GRAPHS

    @app.callback(
        Output("block", "value"),
        Output("image", "value"),
        Output("head", "value"),
        Output("patch", "data"),
        Output("url", "search"),
        Input("url", "search"),
        Input("prev-block", "n_clicks"),
        Input("next-block", "n_clicks"),
        Input("block", "value"),
        Input("image", "value"),
        Input("head", "value"),
        *(Input(graph, "clickData") for graph in graphs),
        State("patch", "data"),
        State("checkpoint", "value"),
    )
    def sync(search: str | None, _prev: int, _next: int, block: int, image: int, head: int, *rest: Any):
        """Read the URL on load and on navigation; otherwise apply the event and write the URL."""
        *clicks, patch, index = rest
        trigger = ctx.triggered_id
        if trigger in (None, "url"):
            current = parse_query(search, limits)
        else:
            current = Selection(int(block or 0), int(image or 0), int(head or 0), patch)
            if trigger in ("prev-block", "next-block"):
                step = -1 if trigger == "prev-block" else 1
                current = replace(current, block=step_block(current.block, step, limits.blocks))
            elif trigger in graphs and clicks[graphs.index(trigger)]:
                ckpt = state[index]
                current = apply_click(
                    current, trigger, clicks[graphs.index(trigger)], ckpt.patch_size(), ckpt.grid_size
                )
        return current.block, current.image, current.head, current.patch, current.query()
