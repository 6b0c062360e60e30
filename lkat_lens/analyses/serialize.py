"""JSON-ready copies of analysis results: tensors to lists, non-finite floats to None (strict JSON); JSON files."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import torch


def json_ready(value: Any) -> Any:
    """Tensors, dataclasses, tuples and non-finite floats made JSON-ready."""
    if dataclasses.is_dataclass(value):
        return {f.name: json_ready(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, torch.Tensor):
        return json_ready(value.tolist())
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(value: dict[str, Any], path: str | os.PathLike) -> None:
    """Write a JSON-ready report as strict JSON (atomically: a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1, allow_nan=False))
    os.replace(tmp, path)
