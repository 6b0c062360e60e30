"""Float comparisons whose absolute tolerance scales with the values compared (CPU-independent tests).

float32 rounding differs between CPUs (SIMD paths, summation order), and the error of a computed value grows with
the magnitude of what it was computed from. `assert_close` therefore reads `atol` per unit of magnitude:
the absolute tolerance used is atol * max(1, max |expected|, max |actual|), never below the stated atol, so a
value that should be 0 next to values of 300 may be off by 300 * atol. `rtol` is used as given.
"""

from __future__ import annotations

import numpy as np
import torch

DEFAULTS = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5)}


def magnitude(*values: torch.Tensor | np.ndarray) -> float:
    """The scale of the compared values: max(1, largest finite absolute value among them)."""
    largest = 1.0
    for v in values:
        t = torch.as_tensor(v).detach()
        if t.is_floating_point() or t.is_complex():
            finite = t.abs()[torch.isfinite(t)]
            if finite.numel():
                largest = max(largest, float(finite.max()))
    return largest


def assert_close(actual, expected, *, rtol: float | None = None, atol: float | None = None, **kwargs) -> None:
    """torch.testing.assert_close with `atol` scaled by the magnitude of the values (see the module docstring)."""
    a, e = torch.as_tensor(actual), torch.as_tensor(expected)
    if rtol is None or atol is None:
        default_rtol, default_atol = DEFAULTS.get(a.dtype, (1e-7, 1e-7))
        rtol = default_rtol if rtol is None else rtol
        atol = default_atol if atol is None else atol
    torch.testing.assert_close(a, e, rtol=rtol, atol=atol * magnitude(a, e), **kwargs)


def assert_allclose(actual, expected, *, rtol: float = 1e-7, atol: float = 0.0) -> None:
    """numpy.testing.assert_allclose with `atol` scaled by the magnitude of the values."""
    np.testing.assert_allclose(
        actual, expected, rtol=rtol, atol=atol * magnitude(np.asarray(actual), np.asarray(expected))
    )


def rel_max(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| in fp64 (absolute where the reference b is all zero, as dgk is at T = 1)."""
    scale = b.double().abs().max()
    return ((a.double() - b.double()).abs().max() / (scale if scale > 0 else 1.0)).item()


def rel_norm(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (Frobenius) in fp64."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()
