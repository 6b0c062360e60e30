"""Local servers for the tests: a free TCP port, and the explorer served in headless Chromium on one.

The suite runs its files in two processes at once (pytest-xdist, Makefile), so a server never takes a fixed port:
dash.testing's runner would give each process's first app 8050.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def dash_browser(app, **options) -> Iterator:
    """dash.testing's composite (no downloads: Debian's chromium and chromium-driver) on `app`, served on a thread on
    a free port; options go to DashComposite (e.g. wait_timeout)."""
    from dash.testing.application_runners import ThreadedRunner
    from dash.testing.composite import DashComposite

    with (
        ThreadedRunner() as server,
        DashComposite(server, browser="chrome", headless=True, percy_run=False, percy_finalize=False, **options) as duo,
    ):
        duo.start_server(app, port=free_port())
        yield duo
