"""benchmarks/bench_model.py --compare: queued steps timed beside synchronised ones, and their ratios to ViT."""

from __future__ import annotations

import time

import pytest
from benchmark_script import imported


@pytest.fixture(scope="module")
def bench():
    """The script as a module."""
    with imported("bench_model") as module:
        yield module


def test_pipelined_ms_is_the_best_round_per_call(bench) -> None:
    """Each round calls fn `iters` times back to back; the result is per call, the fastest of the rounds: a call
    that sleeps 20 ms in the first round and 2 ms after it gives between 2 ms and the first round's 20."""
    calls = []

    def step():
        time.sleep(0.020 if len(calls) < 4 else 0.002)
        calls.append(1)

    ms = bench.pipelined_ms(step, iters=4, device="cpu", rounds=3)
    assert len(calls) == 12
    assert 2.0 <= ms < 20.0, ms


def _row(model: str, train: float, queued_train: float, infer: float, queued_infer: float) -> dict:
    profile = {"device_kernels": None}
    return {
        "model": model,
        "pair": "tiny",
        "compile": "reduce-overhead",
        "train_img_s": train,
        "train_pipelined_img_s": queued_train,
        "infer_img_s": infer,
        "infer_pipelined_img_s": queued_infer,
        "train_profile": profile,
        "train_peak_GiB": None,
    }


def test_compare_ratios_give_queued_ratios_beside_synchronised_ones(bench) -> None:
    rows = [_row("vit_tiny_patch16_224", 100.0, 125.0, 400.0, 500.0), _row("lkat_tiny_patch16_224", 50, 75, 200, 320)]
    bench.compare_ratios(rows)
    lkat = rows[1]
    assert lkat["train_x_vit"] == pytest.approx(0.5) and lkat["train_pipelined_x_vit"] == pytest.approx(0.6)
    assert lkat["infer_x_vit"] == pytest.approx(0.5) and lkat["infer_pipelined_x_vit"] == pytest.approx(0.64)
    assert "train_x_vit" not in rows[0]
