"""lkat-lens: interpretability toolkit for LKAT vision models (Gated Linear Attention + RBF-KAN)."""

from __future__ import annotations

from lkat_lens import models  # registers the LKAT family in timm's registry
from lkat_lens.checkpoint import load
from lkat_lens.models import create_model

__version__ = "0.1.0"
__all__ = ["__version__", "create_model", "load", "models"]
