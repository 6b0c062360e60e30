"""Reproducibility: seeding and capturing/restoring every RNG as weights-only-loadable containers."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_all(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's torch/CUDA/numpy/python RNG states as tensors and plain containers."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "numpy": {
            "name": np_name,
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_gauss),
        },
        "python": {"version": py_version, "state": list(py_state), "gauss_next": py_gauss},
    }


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore what rng_state() captured."""
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
    n = state["numpy"]
    np.random.set_state(
        (n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """Seed of the data loader's generator (data-worker RNGs) for one epoch of one rank."""
    return ((seed * 1_000_003 + epoch) * 1_009 + rank) % 2**63
