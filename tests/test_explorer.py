"""The explorer app: state/caching and URL helpers, and the real app driven in headless Chromium."""

import argparse
import base64
import io
import shutil
import time
from pathlib import Path

import pytest
from lkat_lens.apps import callbacks
from lkat_lens.apps.explorer import BROWSER_UPLOAD_CAP, create_app
from lkat_lens.apps.state import MAX_UPLOAD_BYTES, BadUpload
from PIL import Image
from selenium.webdriver.support.ui import WebDriverWait

from lkat_lens import explore_cli

BROWSER = shutil.which("chromium") and shutil.which("chromedriver")
needs_browser = pytest.mark.skipif(not BROWSER, reason="needs Debian's chromium and chromium-driver on PATH")


@pytest.fixture(scope="module")
def app(digits_checkpoint):
    """The explorer of the digits checkpoint (12 sample images, 4 edges per grid)."""
    return create_app(digits_checkpoint, num_images=12, edges=4)


def png_bytes(size: int = 20) -> bytes:
    """A small RGB PNG: a white vertical bar on black."""
    picture = Image.new("RGB", (size, size))
    picture.paste((255, 255, 255), (size // 3, 2, size // 2, size - 2))
    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    return buffer.getvalue()


def test_block_from_search_and_step():
    assert callbacks.block_from_search("?block=3", 4) == 3
    assert callbacks.block_from_search("block=0&x=1", 4) == 0
    assert callbacks.block_from_search("?block=4", 4) is None
    assert callbacks.block_from_search("?block=-1", 4) is None
    assert callbacks.block_from_search("", 4) is None
    assert callbacks.step_block(0, -1, 4) == 3
    assert callbacks.step_block(3, 1, 4) == 0


def test_decode_upload():
    data = png_bytes()
    assert callbacks.decode_upload("data:image/png;base64," + base64.b64encode(data).decode()) == data
    with pytest.raises(BadUpload):
        callbacks.decode_upload("data:text/plain;base64,not base64!")


def test_cli_defaults_are_safe():
    parser = argparse.ArgumentParser()
    explore_cli.add_arguments(parser)
    args = parser.parse_args(["a.pt", "b.pt"])
    assert args.checkpoints == ["a.pt", "b.pt"]
    assert (args.host, args.port, args.debug) == ("127.0.0.1", 8050, False)


def test_analyses_cached_once_per_block(app):
    ckpt = app.explorer_state[0]
    assert ckpt.model.training is False
    assert ckpt.num_blocks == 4 and ckpt.sample.images.shape == (12, 3, 16, 16)
    first = callbacks.edge_figures(ckpt, 1) + callbacks.gate_figures(ckpt, 1, 0)
    computed = list(ckpt.computed)
    start = time.perf_counter()
    again = callbacks.edge_figures(ckpt, 1) + callbacks.gate_figures(ckpt, 1, 0)
    elapsed = time.perf_counter() - start
    assert ckpt.computed == computed  # nothing recomputed
    assert [f.to_json() for f in again] == [f.to_json() for f in first]
    assert elapsed < 0.5, f"cached block views took {elapsed:.3f}s"
    importance = ckpt.edge_importance(1, "fc1").edge_std
    assert tuple(importance.shape) == (256, 64)  # fc1: embed 64 -> hidden 256
    assert [list(row) for row in first[2].data[0].z] == importance.double().tolist()
    assert "block 1 fc1" in first[0].layout.title.text and "block 1" in first[5].layout.title.text
    assert len(ckpt.predictions(0)) == 5
    probs = [p for _, p in ckpt.predictions(0)]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6


def test_upload_decoding(app):
    ckpt = app.explorer_state[0]
    assert tuple(ckpt.upload(png_bytes()).shape) == (1, 3, 16, 16)
    with pytest.raises(BadUpload, match="not a readable image"):
        ckpt.upload(b"plain text, not an image")
    with pytest.raises(BadUpload, match="over the 2 MiB upload limit"):
        ckpt.upload(png_bytes() + bytes(MAX_UPLOAD_BYTES))
    assert MAX_UPLOAD_BYTES == 2 * 2**20 and BROWSER_UPLOAD_CAP == 4 * MAX_UPLOAD_BYTES


def test_several_checkpoints(digits_checkpoint):
    app = create_app([digits_checkpoint, digits_checkpoint], num_images=2, edges=2)
    state = app.explorer_state
    assert [c.path for c in state.checkpoints] == [digits_checkpoint, digits_checkpoint]
    assert state.num_blocks == 4 and state[1].model is not state[0].model
    card = callbacks.model_card(state[1].info, state[1].num_parameters)
    assert card["variant"] == "lkat_micro" and card["dataset"] == "digits"
    assert card["val top-1 (best)"] == max(m["val_top1"] for m in state[1].info.metrics)


# ---- the real app in headless Chromium ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(app):
    """The app served on a thread and a headless Chromium on it (dash.testing's composite, no downloads)."""
    from dash.testing.application_runners import ThreadedRunner
    from dash.testing.composite import DashComposite

    with (
        ThreadedRunner() as server,
        DashComposite(
            server, browser="chrome", headless=True, percy_run=False, percy_finalize=False, wait_timeout=30
        ) as duo,
    ):
        duo.start_server(app)
        yield duo


def graph_data(duo, graph_id: str) -> list:
    """The traces drawn in a dcc.Graph (waits until there is at least one with data)."""
    script = (
        "const g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
        "return g && g.data && g.data.length ? JSON.stringify([g.data.map(t => t.type), g.layout.title]) : null;"
    )
    return WebDriverWait(duo.driver, 30).until(lambda driver: driver.execute_script(script, graph_id))


def open_tab(duo, label: str) -> None:
    """Click a tab by its label."""
    tab = next(t for t in duo.find_elements("#tabs .tab") if t.text == label)
    tab.click()


def assert_no_console_errors(duo) -> None:
    assert duo.get_logs() == []


@needs_browser
def test_every_tab_renders_a_figure(browser):
    duo = browser
    duo.wait_for_contains_text("#predictions", "top-5 predictions", timeout=30)
    assert len(duo.find_elements("#topk li")) == 5
    duo.wait_for_contains_text("#model-card", '"variant": "lkat_micro"', timeout=30)
    assert '"dataset": "digits"' in duo.find_element("#model-card").text
    assert "scatter" in graph_data(duo, "training-curves")
    views = {
        "Edge functions": ["fc1-curves", "fc2-curves", "edge-importance"],
        "Gates & attention": ["gate-half-life", "gate-heads", "cls-attention"],
        "Tokens": ["token-norms"],
        "Attributions": ["attribution-figure"],
    }
    for label, graphs in views.items():
        open_tab(duo, label)
        for graph_id in graphs:
            assert graph_data(duo, graph_id), f"{label}: {graph_id} has no data"
    assert "heatmap" in graph_data(duo, "attribution-figure")
    assert_no_console_errors(duo)


@needs_browser
def test_block_change_updates_figures_and_url(browser):
    duo = browser
    duo.wait_for_page(url=duo.server_url + "/?block=2")
    open_tab(duo, "Gates & attention")
    duo.wait_for_contains_text("#cls-attention", "block 2", timeout=30)
    assert "block=2" in duo.driver.current_url
    open_tab(duo, "Edge functions")
    before = graph_data(duo, "fc1-curves")
    assert "block 2 fc1" in before
    duo.find_element("#next-block").click()
    duo.wait_for_contains_text("#fc1-curves", "block 3 fc1", timeout=30)
    assert graph_data(duo, "fc1-curves") != before
    WebDriverWait(duo.driver, 10).until(lambda driver: "block=3" in driver.current_url)
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
def test_upload_png_and_non_image(browser, tmp_path: Path):
    duo = browser
    duo.wait_for_page(url=duo.server_url + "/")
    open_tab(duo, "Attributions")
    graph_data(duo, "attribution-figure")
    picture = tmp_path / "bar.png"
    picture.write_bytes(png_bytes())
    duo.find_element("#upload input[type=file]").send_keys(str(picture))
    duo.wait_for_contains_text("#attribution-figure", "attribution of bar.png", timeout=30)
    assert "heatmap" in graph_data(duo, "attribution-figure")
    assert duo.find_element("#upload-message").text == ""
    text = tmp_path / "notes.txt"
    text.write_text("not an image")
    duo.find_element("#upload input[type=file]").send_keys(str(text))
    duo.wait_for_contains_text("#upload-message", "notes.txt: not a readable image", timeout=30)
    assert_no_console_errors(duo)


@needs_browser
def test_oversized_upload_shows_error(browser, tmp_path: Path):
    duo = browser
    duo.wait_for_page(url=duo.server_url + "/")
    open_tab(duo, "Attributions")
    graph_data(duo, "attribution-figure")
    big = tmp_path / "big.png"
    big.write_bytes(png_bytes() + bytes(3 * 2**20))
    duo.find_element("#upload input[type=file]").send_keys(str(big))
    duo.wait_for_contains_text("#upload-message", "big.png: 3.0 MiB is over the 2 MiB upload limit", timeout=30)
    assert_no_console_errors(duo)
