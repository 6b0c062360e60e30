"""Screenshots of the explorer for the README: serve the app locally and capture two tabs in headless Chromium.

    python docs/explorer_screenshots.py [runs/digits-default/best.pt] [--out docs]

Needs Debian's chromium and chromium-driver (the set-up installs them) and a checkpoint (`make train` makes the
default one). Writes explorer_edges.png and explorer_gates.png.
"""

from __future__ import annotations

import argparse
import base64
import logging
import shutil
import threading
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait
from werkzeug.serving import make_server

from lkat_lens.apps.explorer import create_app

SHOTS = {  # file -> (tab label, graphs that must have drawn)
    "explorer_edges.png": ("Edge functions", ["fc1-curves", "edge-coverage", "edge-importance", "edge-detail"]),
    "explorer_gates.png": ("Gates & attention", ["gate-half-life", "gate-channels", "patch-attention", "rollout"]),
}
DRAWN = "const g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot'); return !!(g && g.data?.length);"
WIDTH = 1500


def browser() -> webdriver.Chrome:
    """Headless Chromium through chromedriver, both from PATH."""
    options = webdriver.ChromeOptions()
    options.add_argument("--headless=new")
    options.add_argument("--no-sandbox")
    options.add_argument("--hide-scrollbars")
    options.add_argument(f"--window-size={WIDTH},1200")
    chromium = shutil.which("chromium")
    if chromium:
        options.binary_location = chromium
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def capture(driver: webdriver.Chrome, label: str, graphs: list[str], path: Path) -> None:
    """Open a tab, wait until its graphs have drawn, and save the whole page (beyond the window) as a PNG."""
    tabs = WebDriverWait(driver, 60).until(lambda d: d.find_elements("css selector", "#tabs .tab"))
    next(t for t in tabs if t.text == label).click()
    for graph in graphs:
        WebDriverWait(driver, 120).until(lambda d, g=graph: d.execute_script(DRAWN, g))
    time.sleep(1.0)  # let plotly finish its transitions
    page = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": page["width"], "height": page["height"], "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.write_bytes(base64.b64decode(shot["data"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="*", default=["runs/digits-default/best.pt"])
    parser.add_argument("--out", default=str(Path(__file__).parent), help="folder for the PNGs")
    parser.add_argument("--query", default="?block=2&image=3&head=1", help="selection shown (URL query)")
    args = parser.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    app = create_app(args.checkpoints, num_images=16, edges=8, probe_images=64)
    server = make_server("127.0.0.1", 0, app.server, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    driver = browser()
    try:
        driver.get(f"http://127.0.0.1:{server.server_port}/{args.query}")
        for name, (label, graphs) in SHOTS.items():
            capture(driver, label, graphs, Path(args.out) / name)
            print(f"wrote {Path(args.out) / name}")
    finally:
        driver.quit()
        server.shutdown()


if __name__ == "__main__":
    main()
