"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import datetime
import platform

import torch
import triton


def environment() -> dict:
    """GPU name, versions and date stamped on every row."""
    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({platform.machine()})",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }
