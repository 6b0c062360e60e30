"""benchmarks/bench_flat_params.py: its H200 runs' ratios recomputed by hand, their tensor counts from the models."""

from __future__ import annotations

import json
import statistics

import pytest
from benchmark_script import BENCHMARKS, imported

import lkat_lens
from lkat_lens import recipe as lkrecipe
from lkat_lens.flat_params import FlatParameters

RUNS = sorted((BENCHMARKS / "results").glob("bench_flat_params_*.json"))


@pytest.fixture(scope="module")
def bench():
    with imported("bench_flat_params") as module:
        yield module


def test_both_compile_modes_have_a_run() -> None:
    assert {json.loads(run.read_text())["mode"] for run in RUNS} == {"default", "reduce-overhead"}


@pytest.mark.parametrize("path", RUNS, ids=lambda path: path.stem)
def test_summary_is_each_bases_step_time_over_the_runs(bench, path) -> None:
    """Every pair's ratio (the base's ms over the run's: above 1 is faster than the base), per round, their median
    and of the fastest steps, by hand from the rounds; the file's summary is what the script computes from them."""
    run = json.loads(path.read_text())
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


@pytest.mark.parametrize("name", ["lkat", "vit"])
def test_the_runs_tensor_counts_are_the_models(name) -> None:
    """The runs' optimizer tensors: every parameter as it is, or one flat per weight-decay group and block."""
    for path in RUNS:
        run = json.loads(path.read_text())
        net = lkat_lens.create_model(f"{name}_{run['size']}_patch16_224", num_classes=1000)
        assert run["tensors"][name] == len(list(net.parameters())), path.name
        flat = FlatParameters(net, lkrecipe.param_groups(net, 0.01))
        assert run["tensors"][f"{name}_flat"] == sum(len(group["params"]) for group in flat.param_groups), path.name
