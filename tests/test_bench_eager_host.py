"""benchmarks/bench_eager_host.py: the timers `--compare inside` wraps our code in (the steps it times need CUDA), and
the ratios of its `--compare graphs` runs recomputed from their step times."""

from __future__ import annotations

import json
import statistics
import time

import pytest
import torch
from benchmark_script import BENCHMARKS, imported

from lkat_lens.kernels import gla_core, kan_linear, tuned
from lkat_lens.kernels.rbf import rbf_grid_linear


@pytest.fixture(scope="module")
def bench():
    """The script as a module."""
    with imported("bench_eager_host") as module:
        yield module


def test_a_call_is_charged_the_launches_made_inside_it(bench) -> None:
    """A function that sleeps 20 ms and makes two 10 ms launches: 40 ms in all, 20 of them in launches; each launch
    10 ms, all of it in launches; the launch share reaches the outer call through a call that makes no launch."""
    timers = bench.InsideTimers()
    launch = timers.wrap("launch", lambda: time.sleep(0.010), launch=True)
    middle = timers.wrap("middle", lambda: (launch(), launch()))
    outer = timers.wrap("outer", lambda: (time.sleep(0.020), middle()))
    outer()
    assert timers.calls == {"outer": 1, "middle": 1, "launch": 2}
    assert 0.040 <= timers.seconds["outer"] < 1.0  # sleeps overshoot on a loaded machine, never undershoot
    assert 0.020 <= timers.launch_seconds["outer"] <= timers.seconds["middle"] <= timers.seconds["outer"] - 0.019
    assert timers.launch_seconds["launch"] == timers.seconds["launch"]
    assert timers.launch_seconds["middle"] == timers.launch_seconds["outer"] == timers.seconds["launch"]
    timers.clear()
    assert not timers.seconds and not timers.calls


def test_timed_inside_wraps_our_functions_and_puts_them_back(bench) -> None:
    """Inside the context every autograd Function of ours, the GLA core's kernel host functions and TunedKernel.run
    are wrapped (a forward and backward of the RBF op are counted); afterwards each is the original again."""
    functions = list(bench._our_functions())
    assert {"Eager_gla_core", "Eager_kan_layer", "Eager_rbf_grid_linear"} <= {cls.__name__ for cls in functions}
    methods = {cls: (vars(cls).get("forward"), vars(cls).get("backward")) for cls in functions}
    before = (gla_core.gla_qkv_fwd, kan_linear.backward_and_output, tuned.TunedKernel.run)
    timers = bench.InsideTimers()
    with bench.timed_inside(timers):
        assert gla_core.gla_qkv_fwd is not before[0] and tuned.TunedKernel.run is not before[2]
        x, w = torch.randn(4, 3, requires_grad=True), torch.tensor([[0.5, -1.0, 0.25, 2.0]], requires_grad=True)
        rbf_grid_linear(x, w, -2.0, 2.0, backend="torch").sum().backward()
    assert timers.calls["rbf_grid_linear forward"] == timers.calls["rbf_grid_linear backward"] == 1
    assert (gla_core.gla_qkv_fwd, kan_linear.backward_and_output, tuned.TunedKernel.run) == before
    assert {cls: (vars(cls).get("forward"), vars(cls).get("backward")) for cls in functions} == methods


GRAPH_RUNS = sorted((BENCHMARKS / "results").glob("bench_eager_host_graphs*.json"))


@pytest.mark.parametrize("path", GRAPH_RUNS, ids=lambda path: path.stem)
def test_the_graphs_runs_ratios_are_their_step_times(bench, path) -> None:
    """`--compare graphs` runs (H200): each LKAT's speed against its ViT recomputed by hand from the steps and block
    medians the file holds; every row times ViT and LKAT with its core launched and graphed (bench.GRAPHS)."""
    for row in json.loads(path.read_text()):
        vit, *lkats = row["times"]
        labels = [name.rsplit(", ", 1)[1] for name in lkats]
        assert labels in (list(bench.GRAPHS.values()), ["core launched", "core graphed"])  # the latter: core alone
        for name in lkats:
            fastest = min(row["times"][vit]) / min(row["times"][name])
            typical = statistics.median(row["block_medians"][vit]) / statistics.median(row["block_medians"][name])
            assert row["fastest_x_vit"][name] == pytest.approx(fastest, rel=1e-12)
            assert row["block_median_x_vit"][name] == pytest.approx(typical, rel=1e-12)
        assert set(row["held_MiB"]) == set(row["step_peak_MiB"]) == set(row["times"])
