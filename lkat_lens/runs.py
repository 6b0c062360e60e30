"""A training run's folder as the front ends read it: its main checkpoint, its epoch snapshots and its telemetry.

`lkat-lens train` writes `runs/<name>/{best,last}.pt`, `epoch_NNN.pt` snapshots (`--snapshot-every`), and
`metrics.jsonl` / `telemetry.jsonl`. `lkat-lens figures` and `lkat-lens explore` take the folder itself.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .telemetry_records import read_telemetry, telemetry_path

MAIN_CHECKPOINTS = ("best.pt", "last.pt")  # the one a folder opens as, in order of preference
SNAPSHOT = re.compile(r"^epoch_(\d+)\.pt$")


@dataclass(frozen=True)
class RunFolder:
    """One run folder (no file is read until asked)."""

    path: Path

    @property
    def checkpoint(self) -> Path:
        """The checkpoint the folder opens as: best.pt, else last.pt."""
        for name in MAIN_CHECKPOINTS:
            if (self.path / name).is_file():
                return self.path / name
        raise FileNotFoundError(f"{self.path} is a folder without best.pt or last.pt; is it a lkat-lens run folder?")

    @property
    def snapshots(self) -> list[tuple[int, Path]]:
        """The epoch snapshots as (epoch, path), oldest first."""
        found = [(SNAPSHOT.match(p.name), p) for p in self.path.iterdir()]
        return sorted((int(m[1]), p) for m, p in found if m)

    def telemetry(self) -> list[dict[str, Any]]:
        """The run's telemetry records ([] when it wrote none)."""
        return read_telemetry(self.path) if telemetry_path(self.path).exists() else []


def run_folder_of(path: str | os.PathLike) -> RunFolder | None:
    """The run folder a path names (the folder itself, or the folder of a checkpoint in one), else None."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    has_run_files = telemetry_path(folder).exists() or any((folder / n).is_file() for n in MAIN_CHECKPOINTS)
    return RunFolder(folder) if path.is_dir() or has_run_files else None


def checkpoint_of(path: str | os.PathLike) -> Path:
    """A checkpoint path as given, or the main checkpoint of a run folder."""
    path = Path(path)
    return RunFolder(path).checkpoint if path.is_dir() else path
