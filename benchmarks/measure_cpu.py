"""Re-measure every CPU number the README states, on this machine, and write them to one JSON file.

    python benchmarks/measure_cpu.py [--out benchmarks/results/cpu.json] [--runs 10]

What it runs, each as a whole process the way a user runs it (wall time, monotonic clock):
  1. `lkat-lens train` with its defaults (lkat_micro on digits, the run `make train` makes) into a scratch folder:
     wall time, last and best validation top-1 and the best epoch;
  2. `lkat-lens analyze` and `lkat-lens figures` on that run's best.pt;
  3. `lkat-lens --help` and an argument error: median of `--runs` runs each.
Run it on an otherwise idle machine: every other process on the cores slows what it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
from common import RESULTS, write_result  # benchmarks/ is the script folder

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, str(ROOT / "lkat_lens_cli.py")]


def machine() -> dict[str, object]:
    """The machine the numbers belong to."""
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if "model name" in line), platform.processor())
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": date.today().isoformat(),
    }


def timed(argv: list[str], expect: int = 0) -> float:
    """Wall seconds of one process; its exit status must be `expect`."""
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != expect:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return seconds


def median_of(argv: list[str], runs: int, expect: int = 0) -> float:
    """Median wall seconds of `runs` runs."""
    return statistics.median(timed(argv, expect) for _ in range(runs))


def training(scratch: Path) -> dict[str, float]:
    """The default training run: wall time and its validation accuracy."""
    seconds = timed([*CLI, "train", "--out-dir", str(scratch), "--name", "digits-default"])
    history = [json.loads(line) for line in (scratch / "digits-default" / "metrics.jsonl").read_text().splitlines()]
    best = max(history, key=lambda h: h["val_top1"])  # the first epoch reaching the best, as best.pt keeps it
    return {
        "wall_s": seconds,
        "epochs": history[-1]["epoch"],
        "last_top1": history[-1]["val_top1"],
        "best_top1": best["val_top1"],
        "best_epoch": best["epoch"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS / "cpu.json"))
    parser.add_argument("--runs", type=int, default=10, help="runs per start-up timing")
    args = parser.parse_args(argv)
    results: dict[str, object] = {"machine": machine()}
    results["cli_help_s"] = median_of([*CLI, "--help"], args.runs)
    results["cli_argument_error_s"] = median_of([*CLI, "analyze"], args.runs, expect=2)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        results["train"] = training(scratch)
        best = str(scratch / "digits-default" / "best.pt")
        results["analyze_s"] = timed([*CLI, "analyze", best, "--out", str(scratch / "report.json")])
        results["figures_s"] = timed([*CLI, "figures", best, "--out", str(scratch / "figures")])
    out = write_result(args.out, results, indent=1)
    print(json.dumps(results, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
