"""lkat-lens: interpretability toolkit for LKAT vision models (Gated Linear Attention + RBF-KAN)."""

from __future__ import annotations

try:
    import timm  # noqa: F401
    import torch  # noqa: F401
except ImportError as err:  # a bare checkout: the README's set-up installs everything
    raise ImportError(
        f"lkat-lens needs its dependencies ({err.name} is missing): run the README's set-up "
        "(`make test`, or `pip install -e .` in a Python >= 3.10 environment)"
    ) from None

from . import models  # registers the LKAT family in timm's registry
from .checkpoint import load
from .models import create_model

__version__ = "0.1.0"
__all__ = ["__version__", "create_model", "load", "models"]
