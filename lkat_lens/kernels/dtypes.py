"""The two dtype rules every op here follows: what it accumulates in, and what it returns under autocast."""

from __future__ import annotations

import torch


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """Accumulation dtype: float64 if any operand is float64, else float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def autocast_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype an autocast op (a matmul, a convolution) returns for input x: the autocast dtype when autocast is
    on for x's device (fp64 x excepted), else x's dtype."""
    device = x.device.type
    if torch.is_autocast_enabled(device) and x.dtype != torch.float64:
        return torch.get_autocast_dtype(device)
    return x.dtype
