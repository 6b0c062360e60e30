"""telemetry.jsonl of a run folder: reading, appending and trimming records (plain JSON; the schema is in
docs/telemetry.md). No torch here, so figures and the explorer can read a run without loading a model."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FILENAME = "telemetry.jsonl"
SCHEMA = "lkat-lens/telemetry/1"


def telemetry_path(run_dir: str | os.PathLike) -> Path:
    """Where a run folder keeps its telemetry."""
    return Path(run_dir) / FILENAME


def read_telemetry(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every telemetry record of a run folder (or of a telemetry.jsonl path), in the order written.

    A last line cut short by a kill is skipped; an unreadable line anywhere else is a ValueError."""
    path = Path(run_dir)
    path = path if path.suffix == ".jsonl" else telemetry_path(path)
    if not path.exists():
        raise FileNotFoundError(f"no telemetry at {path} (runs write it unless --no-telemetry)")
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number} is not a JSON record") from None
    return records


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one record as one line."""
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def keep_records_up_to(path: Path, epoch: int, step: int) -> list[dict[str, Any]]:
    """On resume: drop the records written after the checkpoint (epoch, step) the run continues from, rewrite the
    file atomically and return what is kept, so the continued file has no gaps and no duplicates."""
    if not path.exists():
        return []
    kept = [
        r
        for r in read_telemetry(path)
        if (r["kind"] == "epoch" and r["epoch"] <= epoch) or (r["kind"] == "step" and r["step"] <= step)
    ]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    os.replace(tmp, path)
    return kept
