"""benchmarks/bench_short_ops.py: the ratios it reports, recomputed by hand from the rounds of its H200 run."""

from __future__ import annotations

import json
import statistics

import pytest
from benchmark_script import BENCHMARKS, imported

RUN = BENCHMARKS / "results" / "bench_short_ops_tiny_default-h200-2026-11-28.json"


@pytest.fixture(scope="module")
def bench():
    with imported("bench_short_ops") as module:
        yield module


def test_summary_is_vits_step_over_lkats_per_round_and_at_the_fastest_steps(bench) -> None:
    """Each LKAT run's ratio to ViT (ViT's ms over its own: above 1 is faster than ViT), per round, their median and
    of the fastest steps, for both phases; the file's own summary is what the script computes from its rounds."""
    run = json.loads(RUN.read_text())
    rounds = run["rounds"]
    got = bench.summary(rounds)
    assert set(got) == {f"{name} {phase} x vit" for name in ("traced", "ops") for phase in ("train_step", "infer")}
    for name in ("traced", "ops"):
        for phase in ("train_step", "infer"):
            by_hand = [r[f"vit {phase}"]["median"] / r[f"{name} {phase}"]["median"] for r in rounds]
            fastest = min(r[f"vit {phase}"]["min"] for r in rounds) / min(r[f"{name} {phase}"]["min"] for r in rounds)
            entry = got[f"{name} {phase} x vit"]
            assert entry["per_round_median"] == pytest.approx(by_hand, rel=1e-12)
            assert entry["median"] == pytest.approx(statistics.median(by_hand), rel=1e-12)
            assert entry["fastest_steps"] == pytest.approx(fastest, rel=1e-12)
    for key, entry in run["summary"].items():
        assert got[key]["per_round_median"] == pytest.approx(entry["per_round_median"], rel=1e-12)
        assert (got[key]["median"], got[key]["fastest_steps"]) == pytest.approx(
            (entry["median"], entry["fastest_steps"]), rel=1e-12
        )
