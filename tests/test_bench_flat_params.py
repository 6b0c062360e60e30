"""benchmarks/bench_flat_params.py: its H200 run's ratios recomputed by hand, and its tensor counts from the models."""

from __future__ import annotations

import json
import statistics

import pytest
from benchmark_script import BENCHMARKS, imported

import lkat_lens
from lkat_lens import recipe as lkrecipe
from lkat_lens.flat_params import FlatParameters

RUN = BENCHMARKS / "results" / "bench_flat_params_tiny_default-h200-2026-11-28.json"


@pytest.fixture(scope="module")
def bench():
    with imported("bench_flat_params") as module:
        yield module


def test_summary_is_each_bases_step_time_over_the_runs(bench) -> None:
    """Every pair's ratio (the base's ms over the run's: above 1 is faster than the base), per round, their median
    and of the fastest steps, by hand from the rounds; the file's summary is what the script computes from them."""
    run = json.loads(RUN.read_text())
    rounds = run["rounds"]
    for name, base in bench.PAIRS:
        for phase in ("train_step", "infer"):
            by_hand = [r[f"{base} {phase}"]["median"] / r[f"{name} {phase}"]["median"] for r in rounds]
            fastest = min(r[f"{base} {phase}"]["min"] for r in rounds) / min(
                r[f"{name} {phase}"]["min"] for r in rounds
            )
            entry = run["summary"][f"{name} {phase} x {base}"]
            assert entry["per_round_median"] == pytest.approx(by_hand, rel=1e-12)
            assert entry["median"] == pytest.approx(statistics.median(by_hand), rel=1e-12)
            assert entry["fastest_steps"] == pytest.approx(fastest, rel=1e-12)
    assert len(run["summary"]) == 2 * len(bench.PAIRS)


@pytest.mark.parametrize(("name", "model"), [("lkat", "lkat_tiny_patch16_224"), ("vit", "vit_tiny_patch16_224")])
def test_the_runs_tensor_counts_are_the_models(name, model) -> None:
    """The run's optimizer tensors: every parameter as it is, or one flat per weight-decay group and block."""
    run = json.loads(RUN.read_text())
    net = lkat_lens.create_model(model, num_classes=1000)
    assert run["tensors"][name] == len(list(net.parameters()))
    flat = FlatParameters(net, lkrecipe.param_groups(net, 0.01))
    assert run["tensors"][f"{name}_flat"] == sum(len(group["params"]) for group in flat.param_groups)
