"""Helpers shared by the benchmark scripts: the environment stamped on results, and writing a result file."""

from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def environment() -> dict:
    """GPU name, versions and date stamped on every row."""
    import triton  # here, so that scripts which only write results run where triton is missing

    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({platform.machine()})",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }


def dated_result_path(name: str, env: dict) -> Path:
    """RESULTS/<name>-<gpu>-<date>.json for an `environment()`."""
    return RESULTS / f"{name}-{env['gpu'].replace(' ', '_')}-{env['date']}.json"


def device_name(device: torch.device) -> str:
    """The GPU's name on CUDA, else the CPU's (platform.processor(), or "cpu")."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"


def write_result(path: str | Path, payload: Any, *, indent: int = 2) -> Path:
    """Write a result as indented JSON with a final newline (creating its folder); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=indent) + "\n")
    return path
