"""A script of benchmarks/ imported as a module in a test (the scripts import their neighbours from that folder)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@contextmanager
def imported(name: str) -> Iterator[ModuleType]:
    """benchmarks/<name>.py as a module, with benchmarks/ on sys.path meanwhile; afterwards the modules imported from
    that folder are forgotten again."""
    before = set(sys.modules)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        yield importlib.import_module(name)
    for module in set(sys.modules) - before:
        if str(BENCHMARKS) in str(getattr(sys.modules[module], "__file__", "") or ""):
            del sys.modules[module]
