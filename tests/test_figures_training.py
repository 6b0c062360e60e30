"""Telemetry figures: one line per block and layer/head/token type, values exactly those of the records."""

from __future__ import annotations

import torch
from test_telemetry import awake_model

from lkat_lens.figures.training import QUANTITIES, telemetry_figures
from lkat_lens.telemetry import Telemetry
from lkat_lens.telemetry_records import read_telemetry


def test_figures_draw_the_records_of_a_run(tmp_path):
    model = awake_model()  # 2 blocks, GLA, fc1 and fc2
    telemetry = Telemetry(tmp_path, torch.randn(4, 3, 16, 16), lambda line: None)
    telemetry.record(model, kind="step", epoch=0, step=1)
    for epoch in (1, 2, 3):
        with torch.no_grad():
            model.blocks[0].mlp.fc2.dim_linear.weight.mul_(0.5)
        telemetry.record(model, kind="epoch", epoch=epoch, step=epoch)
    records = read_telemetry(tmp_path)
    figures = telemetry_figures(records)
    assert set(figures) == set(QUANTITIES)
    ratio = {t.name: t for t in figures["kan_output_residual_ratio"].data}
    assert sorted(ratio) == ["block 0 · fc1", "block 0 · fc2", "block 1 · fc1", "block 1 · fc2"]
    fc2 = ratio["block 0 · fc2"]
    assert list(fc2.x) == [1, 2, 3]  # epoch records only
    assert list(fc2.y) == [r["blocks"][0]["kan"]["fc2"]["output_residual_ratio"] for r in records[1:]]
    assert fc2.y[0] > fc2.y[1] > fc2.y[2]
    heads = [t.name for t in figures["gate_half_life_median"].data]
    assert heads == ["block 0 · head 0", "block 0 · head 1", "block 1 · head 0", "block 1 · head 1"]
    assert {t.name for t in figures["resid_norm"].data} >= {"block 1 · patches", "block 1 · registers", "block 1 · cls"}


def test_a_model_without_kan_or_gates_gets_no_kan_or_gate_figures():
    entry = {"block": 0, "weight_norm": 1.0, "grad_norm": None, "resid_norm": {"patches": 2.0}, "outlier_patches": 0}
    records = [{"kind": "epoch", "epoch": e, "step": e, "blocks": [entry]} for e in (1, 2)]
    figures = telemetry_figures(records)
    assert set(figures) == {"resid_norm", "outlier_patches", "weight_norm", "grad_norm"}
    assert list(figures["weight_norm"].data[0].y) == [1.0, 1.0]
    assert telemetry_figures([]) == {}
