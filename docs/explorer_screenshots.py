"""Screenshots of the explorer: serve the app locally and capture its tabs in headless Chromium.

    python docs/explorer_screenshots.py [runs/digits-default/ runs/digits-default/last.pt] [--out docs]

Writes the README's two pictures (explorer_edges.png, explorer_gates.png: one checkpoint, 1500 px wide) and
every tab in compare mode (the first checkpoint beside the second) at 1280 and 1600 px window widths,
explorer_compare_<tab>_<width>.png, so that a clipped view shows. Needs Debian's chromium and chromium-driver
(the set-up installs them) and a checkpoint (`make train` makes the default run folder). Each PNG is reduced to
256 colours to stay small.
"""

from __future__ import annotations

import argparse
import base64
import io
import logging
import shutil
import threading
import time
from pathlib import Path

from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait
from werkzeug.serving import make_server

from lkat_lens.apps.explorer import create_app

SINGLE = {  # file -> (tab label, graphs that must have drawn)
    "explorer_edges.png": ("Edge functions", ["fc1-curves", "edge-coverage", "edge-importance", "edge-detail"]),
    "explorer_gates.png": ("Gates & attention", ["gate-half-life", "gate-channels", "patch-attention", "rollout"]),
}
COMPARE = {  # tab value -> (tab label, graphs that must have drawn, the compare column's included)
    "overview": ("Overview", ["training-curves", "compare-training-curves"]),
    "edges": ("Edge functions", ["fc1-curves", "edge-importance", "edge-detail", "compare-edge-importance"]),
    "gates": ("Gates & attention", ["gate-half-life", "rollout", "compare-gate-half-life"]),
    "tokens": ("Tokens", ["token-norms", "token-outliers", "compare-token-norms"]),
    "attributions": ("Attributions", ["attribution-figure", "attribution-curves", "compare-attribution-curves"]),
    "probes": ("Probes", ["probe-figure", "compare-probe-figure"]),
    "training": ("Training", ["telemetry-figure", "snapshot-curves"]),
}
WIDTHS = (1280, 1600)
SINGLE_WIDTH = 1500
DRAWN = (  # a graph with traces, or one that says why it has none
    "const g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
    "return !!(g && (g.data?.length || g.layout?.annotations?.length));"
)


def browser(width: int) -> webdriver.Chrome:
    """Headless Chromium through chromedriver, both from PATH, with a window `width` CSS pixels wide."""
    options = webdriver.ChromeOptions()
    options.add_argument("--headless=new")
    options.add_argument("--no-sandbox")
    options.add_argument("--hide-scrollbars")
    options.add_argument(f"--window-size={width},1000")
    chromium = shutil.which("chromium")
    if chromium:
        options.binary_location = chromium
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def small_png(png: bytes) -> bytes:
    """The screenshot with a 256-colour palette (a fraction of the size, text still sharp)."""
    buffer = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").quantize(256).save(buffer, "PNG", optimize=True)
    return buffer.getvalue()


def capture(driver: webdriver.Chrome, label: str, graphs: list[str], path: Path) -> None:
    """Open a tab, wait until its graphs have drawn, and save the whole page (beyond the window) as a PNG."""
    tabs = WebDriverWait(driver, 60).until(lambda d: d.find_elements("css selector", "#tabs .tab"))
    next(t for t in tabs if t.text == label).click()
    for graph in graphs:
        WebDriverWait(driver, 180).until(lambda d, g=graph: d.execute_script(DRAWN, g))
    time.sleep(1.0)  # let plotly finish its transitions
    page = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": page["width"], "height": page["height"], "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.write_bytes(small_png(base64.b64decode(shot["data"])))
    print(f"wrote {path} ({path.stat().st_size / 1000:.0f} kB)")


def shoot(url: str, width: int, shots: dict[str, tuple[str, list[str]]], out: Path) -> None:
    """Every shot of one window width, in one browser session."""
    driver = browser(width)
    try:
        driver.get(url)
        for name, (label, graphs) in shots.items():
            capture(driver, label, graphs, out / name)
    finally:
        driver.quit()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="*", default=["runs/digits-default/", "runs/digits-default/last.pt"])
    parser.add_argument("--out", default=str(Path(__file__).parent), help="folder for the PNGs")
    parser.add_argument("--query", default="?block=2&image=3&head=1", help="selection shown (URL query)")
    parser.add_argument("--widths", type=int, nargs="*", default=list(WIDTHS), help="compare-mode window widths")
    parser.add_argument("--tabs", nargs="*", default=list(COMPARE), choices=list(COMPARE), help="compare-mode tabs")
    args = parser.parse_args(argv)
    if len(args.checkpoints) < 2:
        parser.error("compare mode needs two checkpoints (or a run folder and a checkpoint)")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    app = create_app(args.checkpoints, num_images=16, edges=8, probe_images=64)
    server = make_server("127.0.0.1", 0, app.server, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/{args.query}"
    out = Path(args.out)
    try:
        if args.widths == list(WIDTHS) and args.tabs == list(COMPARE):
            shoot(url, SINGLE_WIDTH, SINGLE, out)
        for width in args.widths:
            shots = {f"explorer_compare_{tab}_{width}.png": COMPARE[tab] for tab in args.tabs}
            shoot(url + "&compare=1", width, shots, out)
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
