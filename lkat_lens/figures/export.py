"""Figures to files: HTML, or PNG/SVG/PDF through kaleido's Chromium, reproducible byte for byte (shared by every
front end that writes figures)."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

FORMATS = ("png", "svg", "pdf", "html")
STATIC_FORMATS = ("png", "svg", "pdf")
NO_BROWSER = (
    "static export needs a Chromium-based browser on PATH (kaleido drives it); install Debian's chromium "
    "(apt-get install chromium) or use --format html"
)


class BrowserNotFoundError(FileNotFoundError):
    """No Chromium-based browser for kaleido's static export (a user error: the CLI exits 2)."""


def find_browser() -> str | None:
    """The Chromium-based browser kaleido would use, or None."""
    from choreographer.browsers.chromium import Chromium

    return Chromium.find_browser(skip_local=False)


def check_static_export() -> None:
    """Raise BrowserNotFoundError unless kaleido and a Chromium-based browser are both there."""
    if importlib.util.find_spec("kaleido") is None:
        raise BrowserNotFoundError("static export needs kaleido (pip install 'kaleido>=1'); or use --format html")
    if find_browser() is None:
        raise BrowserNotFoundError(NO_BROWSER)


@contextmanager
def export_server() -> Iterator[None]:
    """Kaleido's export server (one browser) for the duration of a with-block."""
    check_static_export()
    import kaleido

    kaleido.start_sync_server(silence_warnings=True)
    try:
        yield
    finally:
        kaleido.stop_sync_server(silence_warnings=True)


def write_figures(figs: Mapping[str, go.Figure], out: Path, fmt: str) -> list[Path]:
    """Write each figure as out/<name>.<fmt> (static formats through one kaleido server); returns the paths."""
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {FORMATS}, got {fmt!r}")
    out.mkdir(parents=True, exist_ok=True)
    figs = {name: with_trace_ids(fig, name) for name, fig in figs.items()}
    paths = [out / f"{name}.{fmt}" for name in figs]
    if fmt == "html":
        for (name, fig), path in zip(figs.items(), paths, strict=True):
            fig.write_html(path, include_plotlyjs="directory", div_id=name, full_html=True)
        return paths
    with export_server(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The kopts argument is ignored")
        pio.write_images(
            list(figs.values()),
            paths,
            format=fmt,
            width=[fig.layout.width for fig in figs.values()],
            height=[fig.layout.height for fig in figs.values()],
        )
    for path in paths:
        make_reproducible(path)
    return paths


def with_trace_ids(fig: go.Figure, name: str) -> go.Figure:
    """A copy whose traces have fixed uids (plotly.js draws random ones into SVG class names otherwise)."""
    fig = go.Figure(fig)
    for i, trace in enumerate(fig.data):
        trace.uid = f"{name}-{i}"
    return fig


def make_reproducible(path: Path) -> None:
    """Replace what Chromium varies between runs: PDF dates (fixed) and the SVG's random id (hash of the name)."""
    if path.suffix == ".pdf":
        data = path.read_bytes()
        path.write_bytes(re.sub(rb"/(CreationDate|ModDate) \(D:\d{14}", rb"/\1 (D:20000101000000", data))
    elif path.suffix == ".svg":
        text = path.read_text()
        found = re.search(r'<defs id="defs-([0-9a-f]+)"', text)
        if found:
            uid = hashlib.sha1(path.name.encode()).hexdigest()[: len(found[1])]
            path.write_text(re.sub(rf'(clip|defs-|legend|["#]g){found[1]}', rf"\g<1>{uid}", text))
