"""Shared fixtures: a real (short) digits training run whose checkpoint several tests read."""

from pathlib import Path

import pytest

from lkat_lens import train


@pytest.fixture(scope="session")
def digits_checkpoint(tmp_path_factory) -> Path:
    """best.pt of a short lkat_micro run on digits (a real training run, a few optimizer steps)."""
    out = tmp_path_factory.mktemp("runs")
    argv = ["--epochs", "1", "--max-steps", "6", "--batch-size", "64", "--threads", "1", "--name", "micro",
            "--out-dir", str(out)]
    assert train.main(argv) == 0
    return out / "micro" / "best.pt"
