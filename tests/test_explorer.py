"""The explorer app: selection, state and caching, and the real app driven in headless Chromium."""

import base64
import io
import re
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from local_server import dash_browser
from PIL import Image
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from lkat_lens import figures
from lkat_lens.apps import selection
from lkat_lens.apps.explorer import BROWSER_UPLOAD_CAP, create_app
from lkat_lens.apps.selection import Limits, Selection
from lkat_lens.apps.state import MAX_UPLOAD_BYTES, BadUpload
from lkat_lens.apps.views import attributions, edges, gates, tokens
from lkat_lens.checkpoint import load, save_checkpoint
from lkat_lens.models import create_model
from lkat_lens_cli import build_parser

BROWSER = shutil.which("chromium") and shutil.which("chromedriver")
needs_browser = pytest.mark.skipif(not BROWSER, reason="needs Debian's chromium and chromium-driver on PATH")
LIMITS = Limits(blocks=4, images=12, heads=2, patches=16)


@pytest.fixture(scope="module")
def vit_checkpoint(digits_checkpoint, tmp_path_factory) -> Path:
    """A randomly initialised timm ViT of lkat_micro's shape on digits: a baseline without KAN layers or gates."""
    torch.manual_seed(0)
    kwargs = dict(img_size=16, patch_size=4, embed_dim=64, depth=4, num_heads=2, num_classes=10)
    model = create_model("vit_tiny_patch16_224", **kwargs)
    path = tmp_path_factory.mktemp("vit") / "vit.pt"
    data = load(digits_checkpoint)[1].data
    save_checkpoint(
        path, model_name="vit_tiny_patch16_224", model_kwargs=kwargs, state_dict=model.state_dict(), data=data
    )
    return path


@pytest.fixture(scope="module")
def app(digits_checkpoint, vit_checkpoint):
    """The explorer of the digits checkpoint (12 sample images, 4 edges per grid), a ViT baseline to compare."""
    return create_app([digits_checkpoint, vit_checkpoint], num_images=12, edges=4, probe_images=96)


def png_bytes(size: int = 20) -> bytes:
    """A small RGB PNG: a white vertical bar on black."""
    picture = Image.new("RGB", (size, size))
    picture.paste((255, 255, 255), (size // 3, 2, size // 2, size - 2))
    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    return buffer.getvalue()


def titles(figs) -> list[str]:
    return [f.layout.title.text for f in figs]


def test_selection_from_and_to_the_url():
    assert selection.parse_query("?block=2&image=3&head=1", LIMITS) == Selection(2, 3, 1, None)
    assert selection.parse_query("block=3&patch=15&x=1", LIMITS) == Selection(3, 0, 0, 15)
    for bad in ("?block=4", "?block=-1", "?head=2&image=12&patch=16", "?block=one", ""):
        assert selection.parse_query(bad, LIMITS) == Selection()
    chosen = Selection(2, 3, 1, 7)
    assert chosen.query() == "?block=2&image=3&head=1&patch=7"
    assert selection.parse_query(chosen.query(), LIMITS) == chosen
    assert Selection(1).query() == "?block=1&image=0&head=0"
    assert selection.step_block(0, -1, 4) == 3 and selection.step_block(3, 1, 4) == 0


def test_url_names_checkpoints_tab_layer_and_edge():
    limits = Limits(blocks=4, images=12, heads=2, patches=16, checkpoints=2)
    view = Selection(1, checkpoint=1, compare=0, tab="edges", layer="fc2", edge=(3, 17))
    assert view.query() == "?block=1&image=0&head=0&checkpoint=1&compare=0&tab=edges&layer=fc2&edge=3.17"
    assert selection.parse_query(view.query(), limits) == view
    assert view.edge_data() == {"block": 1, "layer": "fc2", "q": 3, "p": 17}
    for bad in ("?checkpoint=2&compare=2", "?tab=bogus&layer=fc3", "?edge=3", "?edge=a.b", "?edge=-1.2"):
        assert selection.parse_query(bad, limits) == Selection()
    assert selection.parse_query("?compare=1", LIMITS) == Selection()  # one checkpoint: nothing to compare
    # an edge is kept while checkpoint, block and layer stay, and dropped when one of them moves
    assert selection.keep_edge(replace(view, edge=None, image=5), view) == replace(view, image=5)
    for moved in (dict(block=2), dict(layer="fc1"), dict(checkpoint=0)):
        assert selection.keep_edge(replace(view, **moved), view).edge is None


def test_clicks_move_the_selection():
    start = Selection(0, 1, 0, None)
    heads_click = {"points": [{"x": 1, "y": 3, "curveNumber": 0}]}
    assert selection.apply_click(start, "gate-heads", heads_click, (4, 4), (4, 4)) == Selection(3, 1, 1, None)
    map_click = {"points": [{"x": 2, "y": 2, "curveNumber": 1}]}
    assert selection.apply_click(start, "gate-half-life", map_click, (4, 4), (4, 4)).head == 1
    pixel = {"points": [{"x": 9, "y": 13.5, "curveNumber": 1}]}  # row 3, col 2 of a 4x4 grid of 4-pixel patches
    assert selection.apply_click(start, "cls-attention", pixel, (4, 4), (4, 4)).patch == 3 * 4 + 2
    outside = {"points": [{"x": 9, "y": 17, "curveNumber": 1}]}
    assert selection.apply_click(start, "token-outliers", outside, (4, 4), (4, 4)) == start


def test_decode_upload():
    data = png_bytes()
    assert attributions.decode_upload("data:image/png;base64," + base64.b64encode(data).decode()) == data
    with pytest.raises(BadUpload):
        attributions.decode_upload("data:text/plain;base64,not base64!")


def test_cli_defaults_are_safe():
    args = build_parser().parse_args(["explore", "a.pt", "b.pt"])
    assert args.checkpoints == ["a.pt", "b.pt"]
    assert (args.host, args.port, args.debug) == ("127.0.0.1", 8050, False)
    assert (args.num_images, args.edges, args.probe_images) == (32, 8, 256)


def test_importance_tiles_name_their_strongest_edge():
    edge_std = torch.rand(10, 7, generator=torch.Generator().manual_seed(0))
    full = figures.importance_figure(edge_std, max_cells=16).data[0]
    assert full.z.tolist() == edge_std.double().tolist()
    assert (list(full.x), list(full.y)) == (list(range(7)), list(range(10)))  # a cell is its own edge
    values, strongest, tile = figures.importance_tiles(edge_std, max_cells=4)
    assert tile == (3, 2) and tuple(values.shape) == (4, 4)
    tiled = figures.importance_figure(edge_std, max_cells=4).data[0]
    assert tiled.z.tolist() == values.tolist()
    assert list(tiled.x) == [0, 2, 4, 6] and list(tiled.y) == [0, 3, 6, 9]
    for r in range(4):
        for c in range(4):
            q, p = strongest[r, c].tolist()
            assert 3 * r <= q < 3 * r + 3 and 2 * c <= p < 2 * c + 2
            assert edge_std[q, p] == edge_std[3 * r : 3 * r + 3, 2 * c : 2 * c + 2].max() == values[r, c]


def test_analyses_cached_once_per_block(app):
    ckpt = app.explorer_state[0]
    assert ckpt.model.training is False
    assert ckpt.num_blocks == 4 and ckpt.sample.images.shape == (12, 3, 16, 16)

    def views(block: int) -> list:
        return [
            *edges.block_figures(ckpt, block),
            edges.importance(ckpt, block, "fc1"),
            edges.edge_detail(ckpt, block, "fc1", None),
            *gates.gate_figures(ckpt, block, 1),
            *gates.attention_figures(ckpt, block, 0, 1, None),
            *tokens.token_figures(ckpt, block, 0, None),
        ]

    first = views(1)
    computed = list(ckpt.computed)
    start = time.perf_counter()
    again = views(1)
    elapsed = time.perf_counter() - start
    assert ckpt.computed == computed  # nothing recomputed
    assert [f.to_json() for f in again] == [f.to_json() for f in first]
    assert elapsed < 0.5, f"cached block views took {elapsed:.3f}s"
    assert all(f.data for f in first)
    importance = ckpt.edge_importance(1, "fc1").edge_std
    assert tuple(importance.shape) == (256, 64)  # fc1: embed 64 -> hidden 256, drawn cell by cell
    assert first[3].data[0].z.tolist() == importance.double().tolist()
    q, p, _ = ckpt.edge_importance(1, "fc1").top_edges(1)[0]
    assert f"block 1 fc1 φ[{q},{p}] ≈" in first[4].layout.title.text and "R²" in first[4].layout.title.text
    assert "block 1 fc1" in first[0].layout.title.text and "block 1 head 1" in first[8].layout.title.text
    assert "patch 10 reads" in first[9].layout.title.text  # centre of the 4x4 grid
    assert titles(views(2)) != titles(first)


def test_clicked_edge_gets_its_curve_and_symbolic_fit(app):
    ckpt = app.explorer_state[0]
    heatmap = edges.importance(ckpt, 2, "fc2").data[0]  # fc2: [64, 256], drawn in 1x1 tiles
    assert (heatmap.x[17], heatmap.y[5]) == (17, 5)
    assert edges.clicked_edge(ckpt, 2, "fc2", {"x": 17, "y": 5}) == (5, 17)
    fig = edges.edge_detail(ckpt, 2, "fc2", {"block": 2, "layer": "fc2", "q": 5, "p": 17})
    curve, fit = fig.data[1], fig.data[2]
    curves, result = ckpt.edge_fit(2, "fc2", (5, 17))
    assert list(curve.y) == curves.values[0].tolist() and "φ[5,17]" in fig.layout.title.text
    fitted = (curves.x >= curves.centers[0]) & (curves.x <= curves.centers[-1])  # drawn where it was fitted
    assert list(fit.x) == curves.x[fitted].tolist() and min(fit.x) >= -2 and max(fit.x) <= 2
    assert list(fit.y) == result.best(curves.x[fitted]).tolist() and result.best.formula() in fit.name
    stale = edges.edge_detail(ckpt, 1, "fc2", {"block": 2, "layer": "fc2", "q": 5, "p": 17})
    assert "block 1 fc2" in stale.layout.title.text and "φ[5,17]" not in stale.layout.title.text
    (frame,) = edges.importance(ckpt, 2, "fc2", {"block": 2, "layer": "fc2", "q": 5, "p": 17}).layout.shapes
    assert (frame.x0, frame.x1, frame.y0, frame.y1) == (16.5, 17.5, 4.5, 5.5)  # the clicked cell is framed
    q, p, _ = ckpt.edge_importance(2, "fc2").top_edges(1)[0]
    assert f"framed: φ[{q},{p}]" in edges.importance(ckpt, 2, "fc2").layout.title.text  # unclicked: top


def test_patch_maps_show_the_image_beside_the_map(app):
    """Issue 13 item 12: at 16x16 pixels a 4x4 map covers the image, so the image is also drawn alone beside it."""
    ckpt = app.explorer_state[0]
    fig = gates.rollout_figure(ckpt, 3, "attention", None)
    under, heat, alone = fig.data
    assert (heat.xaxis, under.xaxis, alone.xaxis) == ("x2", "x2", "x")
    assert alone.opacity is None and np.array_equal(np.asarray(alone.z), ckpt.shown[3])
    np.testing.assert_array_equal(np.asarray(heat.z, dtype=float), ckpt.rollout(3, "attention").cls_map[0].double())
    assert [shape.xref for shape in fig.layout.shapes] == ["x", "x2"]  # the centre patch framed in both


def test_compare_mode_draws_edge_grids_two_panels_wide(app):
    ckpt = app.explorer_state[0]

    def columns(fig) -> int:
        return len({fig.layout[f"xaxis{i + 1 if i else ''}"].domain for i in range(4)})  # the app draws 4 edges

    assert columns(edges.block_figures(ckpt, 1)[0]) == 4
    assert columns(edges.block_figures(ckpt, 1, edges.COMPARE_COLUMNS)[0]) == 2


def test_attribution_class_choice_and_faithfulness(app):
    ckpt = app.explorer_state[0]
    predicted = ckpt.attribution(0, "saliency").target.item()
    other = (predicted + 1) % 10
    overlay, curves = attributions.dataset_figures(ckpt, 0, "saliency", other)
    assert f"class {ckpt.class_name(other)}<br>in image 0" in overlay.layout.title.text
    assert ckpt.faithfulness(0, "saliency", other).target.tolist() == [other]
    assert [t.name.split(" ")[0] for t in curves.data] == ["deletion", "insertion"]
    overlay, _ = attributions.dataset_figures(ckpt, 0, "saliency", None)
    assert "the predicted class" in overlay.layout.title.text


def test_upload_decoding(app):
    ckpt = app.explorer_state[0]
    loaded = ckpt.upload(png_bytes(), "bar.png")
    assert tuple(loaded.tensor.shape) == (3, 16, 16)
    assert loaded.notes == ("resized and center-cropped 20x20 to the model's 16x16",)
    with pytest.raises(BadUpload, match="notes.txt is not an image file"):
        ckpt.upload(b"plain text, not an image", "notes.txt")
    with pytest.raises(BadUpload, match="over the 2 MiB upload limit"):
        ckpt.upload(png_bytes() + bytes(MAX_UPLOAD_BYTES))
    assert MAX_UPLOAD_BYTES == 2 * 2**20 and BROWSER_UPLOAD_CAP == 4 * MAX_UPLOAD_BYTES


def test_baseline_views_say_not_applicable(app, digits_checkpoint, vit_checkpoint):
    state = app.explorer_state
    assert [c.path for c in state.checkpoints] == [digits_checkpoint, vit_checkpoint]
    vit = state[1]
    assert (vit.has_kan, vit.has_gates, state.num_blocks, state.num_heads) == (False, False, 4, 2)
    assert all("not applicable" in t for t in titles(edges.block_figures(vit, 0)))
    assert "not applicable" in edges.importance(vit, 0, "fc1").layout.title.text
    assert all("no GLA forget gates" in t for t in titles(gates.gate_figures(vit, 0, 0)))
    cls, row = gates.attention_figures(vit, 3, 0, 1, None)  # softmax attention applies
    assert "CLS attention" in cls.layout.title.text and "attention row" in row.layout.title.text
    card = vit.card()
    assert card["variant"] == "vit_tiny_patch16_224" and card["dataset"] == "digits"
    assert card["architecture"]["attention"] == "softmax" and "KAN basis" not in card["architecture"]


def test_probes_are_fitted_once(app):
    ckpt = app.explorer_state[0]
    results = ckpt.probes()
    assert ckpt.probes() is results and results.num_train == 96 and results.num_test == 12
    fig = figures.probe_figure(results, depth=2)
    assert len(fig.data) == 4 and len(fig.data[0].y) == 5  # cls/mean_patch x held-out/train, depths 0..4


# ---- the real app in headless Chromium ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(app):
    """The app served on a thread and a headless Chromium on it (local_server.dash_browser)."""
    with dash_browser(app, wait_timeout=30) as duo:
        yield duo


def graph_data(duo, graph_id: str) -> str:
    """The trace types and title of a dcc.Graph as JSON (waits until it has a trace)."""
    script = (
        "const g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
        "return g && g.data && g.data.length ? JSON.stringify([g.data.map(t => t.type), g.layout.title]) : null;"
    )
    return WebDriverWait(duo.driver, 30).until(lambda driver: driver.execute_script(script, graph_id))


def wait_for_url(duo, *parts: str) -> str:
    """Wait until the page URL contains every part; return it."""
    WebDriverWait(duo.driver, 30).until(lambda driver: all(p in driver.current_url for p in parts))
    return duo.driver.current_url


def open_page(duo, query: str = "") -> None:
    """Load the app at a query string and wait for it to draw."""
    duo.wait_for_page(url=duo.server_url + "/" + query)
    duo.wait_for_contains_text("#predictions", "top-5 predictions", timeout=30)


def open_tab(duo, label: str) -> None:
    """Click a tab by its label."""
    tab = next(t for t in duo.find_elements("#tabs .tab") if t.text == label)
    tab.click()


def click_plot(duo, graph_id: str, subplot: int = 0) -> dict:
    """A real mouse click in the middle of one subplot of a graph; returns the point plotly reports."""
    listen = (
        "const g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot'); window.clicked = null;"
        "g.on('plotly_click', e => { const p = e.points[0];"
        " window.clicked = {x: p.x, y: p.y, curve: p.curveNumber, customdata: p.customdata}; });"
    )
    duo.driver.execute_script(listen, graph_id)
    area = duo.find_elements(f"#{graph_id} .nsewdrag")[subplot]
    ActionChains(duo.driver).move_to_element(area).click().perform()
    return WebDriverWait(duo.driver, 10).until(lambda driver: driver.execute_script("return window.clicked;"))


def assert_no_console_errors(duo) -> None:
    assert duo.get_logs() == []


@needs_browser
def test_every_tab_renders_a_figure(browser):
    duo = browser
    open_page(duo)
    assert len(duo.find_elements("#topk li")) == 5
    duo.wait_for_contains_text("#model-card", "KAN basis:  shared", timeout=30)
    assert re.search(r"^dataset: +digits$", duo.find_element("#model-card").text, re.M)
    assert "scatter" in graph_data(duo, "training-curves")
    views = {
        "Edge functions": ["fc1-curves", "fc2-curves", "edge-coverage", "edge-importance", "edge-detail"],
        "Gates & attention": ["gate-half-life", "gate-heads", "gate-channels", "cls-attention", "patch-attention"],
        "Tokens": ["token-norms", "token-outliers"],
        "Attributions": ["attribution-figure", "attribution-curves"],
        "Probes": ["probe-figure"],
    }
    for label, graphs in views.items():
        open_tab(duo, label)
        for graph_id in graphs:
            assert graph_data(duo, graph_id), f"{label}: {graph_id} has no data"
    open_tab(duo, "Gates & attention")
    assert "heatmap" in graph_data(duo, "rollout")
    open_tab(duo, "Attributions")
    assert "heatmap" in graph_data(duo, "attribution-figure")
    assert_no_console_errors(duo)


@needs_browser
def test_block_change_updates_figures_and_url(browser):
    duo = browser
    open_page(duo, "?block=2")
    open_tab(duo, "Gates & attention")
    duo.wait_for_contains_text("#cls-attention", "block 2", timeout=30)
    assert "block=2" in duo.driver.current_url
    open_tab(duo, "Edge functions")
    before = graph_data(duo, "fc1-curves")
    assert "block 2 fc1" in before
    duo.find_element("#next-block").click()
    duo.wait_for_contains_text("#fc1-curves", "block 3 fc1", timeout=30)
    assert graph_data(duo, "fc1-curves") != before
    duo.wait_for_contains_text("#edge-coverage", "block 3", timeout=30)
    wait_for_url(duo, "block=3")
    duo.find_element("#next-block").click()  # wraps around
    duo.wait_for_contains_text("#fc1-curves", "block 0 fc1", timeout=30)
    duo.find_element("#prev-block").click()
    duo.wait_for_contains_text("#edge-importance", "block 3 fc1", timeout=30)
    duo.driver.refresh()  # the URL keeps the block
    duo.wait_for_contains_text("#block", "3", timeout=30)
    open_tab(duo, "Edge functions")
    duo.wait_for_contains_text("#fc1-curves", "block 3 fc1", timeout=30)
    assert_no_console_errors(duo)


@needs_browser
def test_url_restores_block_image_and_head(browser):
    duo = browser
    open_page(duo, "?block=2&image=3&head=1")
    duo.wait_for_contains_text("#predictions", "image 3 (label", timeout=30)
    assert [duo.find_element(f"#{i}").text.split(" ")[0] for i in ("block", "image", "head")] == ["2", "3", "1"]
    open_tab(duo, "Gates & attention")
    duo.wait_for_contains_text("#cls-attention", "block 2 head 1", timeout=30)
    duo.wait_for_contains_text("#gate-channels", "block 2 head 1", timeout=30)
    assert "block=2&image=3&head=1" in duo.driver.current_url
    assert_no_console_errors(duo)


@needs_browser
def test_block_keys(browser):
    duo = browser
    open_page(duo, "?block=1")
    open_tab(duo, "Edge functions")
    duo.wait_for_contains_text("#fc1-curves", "block 1 fc1", timeout=30)
    duo.find_element("h2").click()  # focus outside any field
    ActionChains(duo.driver).send_keys("]").perform()
    duo.wait_for_contains_text("#fc1-curves", "block 2 fc1", timeout=30)
    ActionChains(duo.driver).send_keys(Keys.ARROW_LEFT).perform()
    duo.wait_for_contains_text("#fc1-curves", "block 1 fc1", timeout=30)
    ActionChains(duo.driver).send_keys("[").perform()
    wait_for_url(duo, "block=0")
    assert_no_console_errors(duo)


@needs_browser
def test_clicks_select_edge_head_and_patch(browser, app):
    duo = browser
    open_page(duo, "?block=1")
    open_tab(duo, "Edge functions")
    graph_data(duo, "edge-importance")
    q, p = edges.clicked_edge(app.explorer_state[0], 1, "fc1", click_plot(duo, "edge-importance"))
    duo.wait_for_contains_text("#edge-detail", f"block 1 fc1 φ[{q},{p}] ≈", timeout=30)
    duo.wait_for_contains_text("#edge-importance", f"framed: φ[{q},{p}]", timeout=30)  # highlighted in the map
    open_tab(duo, "Gates & attention")
    graph_data(duo, "gate-heads")
    point = click_plot(duo, "gate-heads")  # x: head, y: block
    wait_for_url(duo, f"block={point['y']}", f"head={point['x']}")
    duo.wait_for_contains_text("#gate-channels", f"block {point['y']} head {point['x']}", timeout=30)
    point = click_plot(duo, "gate-half-life", subplot=1)  # the second head's map
    wait_for_url(duo, f"head={point['curve']}")
    duo.wait_for_contains_text("#cls-attention", f"head {point['curve']}: CLS", timeout=30)  # redrawn for the head
    point = click_plot(duo, "cls-attention", subplot=1)  # on the overlay, in pixels of the 16x16 image
    patch = int(round(point["y"])) // 4 * 4 + int(round(point["x"])) // 4
    wait_for_url(duo, f"patch={patch}")
    duo.wait_for_contains_text("#patch-attention", f"what patch {patch} reads", timeout=30)
    duo.wait_for_contains_text("#patch-label", f"patch {patch} (row", timeout=30)
    open_tab(duo, "Tokens")
    duo.wait_for_contains_text("#token-norms", f"patch {patch}", timeout=30)
    assert_no_console_errors(duo)


@needs_browser
def test_link_reopens_tab_layer_edge_and_compare(browser, app):
    duo = browser
    open_page(duo, "?block=1")
    open_tab(duo, "Edge functions")
    wait_for_url(duo, "tab=edges")
    duo.find_element("#edge-layer input[value='fc2']").click()
    wait_for_url(duo, "layer=fc2")
    duo.wait_for_contains_text("#edge-importance", "block 1 fc2", timeout=30)
    q, p = edges.clicked_edge(app.explorer_state[0], 1, "fc2", click_plot(duo, "edge-importance"))
    wait_for_url(duo, f"edge={q}.{p}")
    assert (q, p) != edges.chosen_edge(app.explorer_state[0], 1, "fc2", None)  # not what the view shows unasked
    duo.select_dcc_dropdown("#compare", index=1)
    link = wait_for_url(duo, "compare=1")
    duo.driver.get("about:blank")
    open_page(duo, "?" + link.split("?", 1)[1])  # the link alone reopens the view
    duo.wait_for_contains_text("#edge-detail", f"block 1 fc2 φ[{q},{p}] ≈", timeout=30)
    duo.wait_for_contains_text("#compare-edges", "not applicable", timeout=30)
    duo.find_element("#next-block").click()  # another block: its most important edge, and no edge in the link
    duo.wait_for_contains_text("#edge-detail", "block 2 fc2 φ[", timeout=30)
    WebDriverWait(duo.driver, 30).until(lambda driver: "block=2" in driver.current_url)
    assert "edge=" not in duo.driver.current_url and "layer=fc2" in duo.driver.current_url
    assert_no_console_errors(duo)


OVERFLOWING = """
const found = [];
for (const row of document.querySelectorAll('.side-by-side')) {
  if (!row.offsetParent) continue;  // a hidden tab
  const panes = [...row.querySelectorAll(':scope > .view-pane, :scope > .compare-pane')];
  for (const pane of panes) {
    const right = pane.getBoundingClientRect().right;
    for (const g of pane.querySelectorAll('.js-plotly-plot'))
      if (g.getBoundingClientRect().right > right + 1) found.push(g.parentElement.id || 'a graph');
  }
  const [view, compare] = panes.map(p => p.getBoundingClientRect().width);
  if (compare < 0.45 * (view + compare)) found.push('the compare column is narrow: ' + compare + ' of ' + view);
}
return found;
"""


def assert_fits_side_by_side(duo) -> None:
    """No graph of the open tab reaches past its half of the page, and the halves are about equal."""
    assert duo.driver.execute_script(OVERFLOWING) == []


@needs_browser
def test_compare_with_a_baseline(browser):
    """Every tab side by side with a ViT baseline, then the same run, at a 1280 px window: nothing overflows."""
    duo = browser
    duo.driver.set_window_size(1280, 1000)
    open_page(duo, "?block=1")
    duo.select_dcc_dropdown("#compare", index=1)
    duo.wait_for_contains_text("#compare-overview", "vit_tiny_patch16_224", timeout=30)
    duo.wait_for_element("#compare-training-curves .js-plotly-plot", timeout=30)  # the baseline may have no curves
    assert_fits_side_by_side(duo)
    open_tab(duo, "Edge functions")
    duo.wait_for_contains_text("#compare-edges", "not applicable", timeout=30)
    graph_data(duo, "fc1-curves")
    assert_fits_side_by_side(duo)
    open_tab(duo, "Tokens")
    assert "scatter" in graph_data(duo, "compare-token-norms")
    graph_data(duo, "token-outliers")
    assert_fits_side_by_side(duo)
    open_tab(duo, "Attributions")
    duo.wait_for_contains_text("#compare-attributions", "in image 0", timeout=60)
    assert "heatmap" in graph_data(duo, "compare-attribution-figure")
    graph_data(duo, "attribution-curves")
    assert_fits_side_by_side(duo)
    open_tab(duo, "Probes")
    assert graph_data(duo, "compare-probe-figure")
    assert_fits_side_by_side(duo)
    duo.select_dcc_dropdown("#compare", index=0)  # the same run side by side
    open_tab(duo, "Gates & attention")
    graph_data(duo, "compare-gate-half-life")
    graph_data(duo, "rollout")
    assert_fits_side_by_side(duo)
    open_tab(duo, "Edge functions")
    duo.wait_for_contains_text("#compare-edges", "block 1 fc1", timeout=30)
    graph_data(duo, "compare-fc2-curves")
    assert_fits_side_by_side(duo)
    assert_no_console_errors(duo)


def upload(duo, folder: Path, name: str, content: bytes) -> None:
    """Send a file to the Attributions tab's upload field."""
    path = folder / name
    path.write_bytes(content)
    duo.find_element("#upload input[type=file]").send_keys(str(path))


@needs_browser
def test_a_sample_image_replaces_the_upload_everywhere(browser, tmp_path: Path):
    """Issue 13 item 2: after an upload, picking a sample image shows that image through method and class
    changes, tab switches and the compare column; a corrupt upload clears the previous upload's figures."""
    duo = browser
    open_page(duo)
    open_tab(duo, "Attributions")
    graph_data(duo, "attribution-figure")
    upload(duo, tmp_path, "bar.png", png_bytes())
    duo.wait_for_contains_text("#attribution-figure", "in bar.png", timeout=30)
    duo.wait_for_contains_text("#predictions", "uploaded bar.png top-5 predictions", timeout=30)
    assert duo.find_element("#upload-message").text == "bar.png: resized and center-cropped 20x20 to the model's 16x16"
    duo.select_dcc_dropdown("#image", index=3)
    duo.wait_for_contains_text("#attribution-figure", "in image 3", timeout=30)
    duo.select_dcc_dropdown("#method", value="saliency")
    duo.wait_for_contains_text("#attribution-figure", "saliency attribution of the predicted class", 30)
    assert "in image 3" in duo.find_element("#attribution-figure").text
    duo.select_dcc_dropdown("#target", value="2: 2")
    duo.wait_for_contains_text("#attribution-figure", "saliency attribution of class 2", timeout=30)
    assert "in image 3" in duo.find_element("#attribution-figure").text
    assert "image 3 (label" in duo.find_element("#predictions").text
    assert duo.find_element("#upload-message").text == ""
    open_tab(duo, "Overview")
    open_tab(duo, "Attributions")
    duo.wait_for_contains_text("#attribution-figure", "in image 3", timeout=30)
    assert "of class 2" in duo.find_element("#attribution-figure").text
    duo.select_dcc_dropdown("#compare", index=1)
    duo.wait_for_contains_text("#compare-attributions", "in image 3", timeout=60)
    assert "saliency attribution of class 2" in duo.find_element("#compare-attributions").text
    upload(duo, tmp_path, "bar2.png", png_bytes(24))  # the compare column follows the upload too
    duo.wait_for_contains_text("#compare-attributions", "in bar2.png", timeout=60)
    duo.wait_for_contains_text("#attribution-figure", "in bar2.png", timeout=30)
    duo.wait_for_contains_text("#predictions", "uploaded bar2.png", timeout=30)
    upload(duo, tmp_path, "notes.txt", b"not an image")
    duo.wait_for_contains_text("#upload-message", "notes.txt is not an image file PIL can read", timeout=30)
    duo.wait_for_contains_text("#attribution-figure", "no attribution: notes.txt is not a usable image", 30)
    duo.wait_for_contains_text("#compare-attributions", "no attribution: notes.txt", timeout=30)
    duo.wait_for_contains_text("#predictions", "notes.txt: no predictions", timeout=30)
    assert "bar2.png" not in duo.find_element("#attribution-figure").text
    duo.select_dcc_dropdown("#image", index=5)
    duo.wait_for_contains_text("#attribution-figure", "in image 5", timeout=30)
    duo.wait_for_contains_text("#compare-attributions", "in image 5", timeout=60)
    assert duo.find_element("#upload-message").text == ""
    assert_no_console_errors(duo)


@needs_browser
def test_oversized_upload_shows_error(browser, tmp_path: Path):
    duo = browser
    open_page(duo)
    open_tab(duo, "Attributions")
    graph_data(duo, "attribution-figure")
    big = tmp_path / "big.png"
    big.write_bytes(png_bytes() + bytes(3 * 2**20))
    duo.find_element("#upload input[type=file]").send_keys(str(big))
    duo.wait_for_contains_text("#upload-message", "big.png: 3.0 MiB is over the 2 MiB upload limit", timeout=30)
    assert_no_console_errors(duo)


@needs_browser
def test_interventions_tab_toggles_a_gate_clamp_and_the_predictions_change(browser):
    duo = browser
    open_page(duo, "?block=0&head=0")
    open_tab(duo, "Interventions")
    duo.wait_for_contains_text("#intervened-predictions", "with no intervention", timeout=60)
    clean = duo.find_element("#topk-clean").text
    assert duo.find_element("#topk-intervened").text == clean
    duo.find_element("#clamp input[value='α = 0 (forget at once)']").click()
    duo.wait_for_contains_text("#intervened-predictions", "with block 0 head 0 α = 0", timeout=60)
    assert len(duo.find_elements("#topk-intervened li")) == 5
    assert duo.find_element("#topk-intervened").text != clean
    assert duo.find_element("#topk-clean").text == clean
    for graph_id, kind in [("patching-grid", "heatmap"), ("patching-heads", "heatmap"), ("clamp-sweep", "heatmap")]:
        assert kind in graph_data(duo, graph_id)
    assert "table" in graph_data(duo, "swap-table") and "scatter" in graph_data(duo, "prune-curve")
    assert_no_console_errors(duo)
