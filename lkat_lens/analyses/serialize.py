"""JSON-ready copies of analysis results: tensors to lists, non-finite floats to None (strict JSON)."""

from __future__ import annotations

import dataclasses
import math
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
