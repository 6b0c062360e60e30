"""Training telemetry: the analyses' own values on the probe batch, the two new quantities against independent
computations, the diagnostics, the file through resume, and epoch snapshots."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tolerance import assert_close

import lkat_lens
from lkat_lens import create_model
from lkat_lens import train as lktrain
from lkat_lens.analyses.edge_functions import edge_importance, layer_statistics
from lkat_lens.analyses.gates import gate_statistics, half_life
from lkat_lens.analyses.parts import kan_layers
from lkat_lens.analyses.tokens import token_norms
from lkat_lens.telemetry import (
    DORMANT_RATIO,
    Telemetry,
    measure,
    output_residual_ratio,
    probe_batch,
)
from lkat_lens.telemetry_records import read_telemetry

TINY = "--model lkat_micro --img-size 16 --batch-size 4 --threads 1 --data imagefolder --recipe plain".split()


pytestmark = pytest.mark.usefixtures("keep_torch_threads")


def awake_model() -> torch.nn.Module:
    """lkat_micro whose KAN layers are scaled up so that each writes O(1) outputs (none dormant)."""
    torch.manual_seed(0)
    model = create_model("lkat_micro", num_classes=10, img_size=16, depth=2)
    with torch.no_grad():
        for layer in kan_layers(model).values():
            layer.dim_linear.weight.normal_(0.0, layer.in_features**-0.5)
            layer.grid_linear.weight.fill_(1.0)
    return model


def test_telemetry_equals_the_analyses_on_the_same_batch():
    model = awake_model()
    images = torch.randn(6, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    blocks = measure(model, images, top_k=4)
    with torch.no_grad():
        model.eval()
        gates = gate_statistics(model, images)
        norms = token_norms(model, images)
        stats = layer_statistics(model, images)
    groups = norms.group_norms()
    for i, entry in enumerate(blocks):
        assert entry["resid_norm"]["patches"] == pytest.approx(float(groups["patches"][i + 1].mean()), rel=1e-6)
        assert entry["resid_norm"]["cls"] == pytest.approx(float(groups["cls"][i + 1].mean()), rel=1e-6)
        assert entry["outlier_patches"] == int(norms.outliers[i + 1].sum())
        got = torch.tensor(entry["gates"]["half_life_quantiles"], dtype=torch.float64)
        assert_close(got, half_life(gates.head_log_alpha_quantiles[i]), rtol=1e-9, atol=1e-9)
        for name, h in gates.head_half_life_by_type.items():
            assert_close(
                torch.tensor(entry["gates"]["half_life_by_type"][name], dtype=torch.float64), h[i], rtol=1e-9, atol=1e-9
            )
        for short in ("fc1", "fc2"):
            full, kan = f"blocks.{i}.mlp.{short}", entry["kan"][short]
            assert kan["outside_fraction"] == stats[full].coverage.outside_fraction
            top = edge_importance(kan_layers(model)[full], stats[full]).top_edges(4)
            assert [tuple(e[:2]) for e in kan["top_edges"]] == [e[:2] for e in top]
            assert_close(torch.tensor([e[2] for e in kan["top_edges"]]), torch.tensor([e[2] for e in top]), rtol=1e-6)


def test_output_residual_ratio_against_a_loop():
    gen = torch.Generator().manual_seed(0)
    out, resid = torch.randn(3, 5, 8, generator=gen), 4 * torch.randn(3, 5, 8, generator=gen)
    norms = lambda t: [float(np.linalg.norm(t[b, n].double().numpy())) for b in range(3) for n in range(5)]  # noqa: E731
    assert output_residual_ratio(out, resid) == pytest.approx(np.mean(norms(out)) / np.mean(norms(resid)), rel=1e-9)


def test_dormant_kan_diagnostic_fires_on_a_zeroed_fc2_once_and_not_on_a_healthy_model(tmp_path):
    images = torch.randn(6, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    lines: list[str] = []
    healthy = awake_model()
    Telemetry(tmp_path / "healthy", images, lines.append).record(healthy, kind="epoch", epoch=1, step=1)
    assert not [line for line in lines if "dormant" in line]
    ratios = [kan["output_residual_ratio"] for b in measure(healthy, images) for kan in b["kan"].values()]
    assert min(ratios) > 10 * DORMANT_RATIO

    dead = awake_model()
    with torch.no_grad():
        dead.blocks[1].mlp.fc2.dim_linear.weight.zero_()
    telemetry = Telemetry(tmp_path / "dead", images, lines.append)
    for epoch in (1, 2):
        telemetry.record(dead, kind="epoch", epoch=epoch, step=epoch)
    dormant = [line for line in lines if "dormant" in line]
    assert dormant == [dormant[0]] and dormant[0].startswith("diagnostic: block 1 fc2: KAN layer dormant")
    assert len(read_telemetry(tmp_path / "dead")) == 2


def test_probe_batch_is_fixed_by_the_seed():
    data = [(torch.full((1,), float(i)), i) for i in range(50)]
    a, b, c = probe_batch(data, 8, 3), probe_batch(data, 8, 3), probe_batch(data, 8, 4)
    assert torch.equal(a, b) and not torch.equal(a, c) and a.shape == (8, 1)


def test_run_writes_one_record_per_epoch_and_step_records_and_resume_leaves_no_duplicates(tmp_path, folder, capsys):
    common = [*TINY, "--data-dir", str(folder), "--out-dir", str(tmp_path), "--telemetry-every", "2"]
    assert lktrain.main([*common, "--epochs", "3", "--max-steps", "6", "--name", "r"]) == 0  # 3 steps/epoch
    run = tmp_path / "r"
    # a kill after epoch 3's telemetry but before its last.pt leaves records past the checkpoint (epoch 2)
    records = read_telemetry(run)
    assert [(r["kind"], r["step"]) for r in records] == [
        ("step", 2),
        ("epoch", 3),
        ("step", 4),
        ("step", 6),
        ("epoch", 6),
    ]
    with (run / "telemetry.jsonl").open("a") as f:
        f.write(json.dumps({**records[-1], "epoch": 3, "step": 8}) + "\n" + json.dumps({**records[0], "step": 8}))
    assert lktrain.main(["--resume", str(run / "last.pt"), "--threads", "1"]) == 0
    records = read_telemetry(run)
    assert [r["epoch"] for r in records if r["kind"] == "epoch"] == [1, 2, 3]
    assert [r["step"] for r in records if r["kind"] == "step"] == [2, 4, 6, 8]
    assert {len(r["blocks"]) for r in records} == {4} and records[0]["images"] == 6  # all 6 val images
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 3


def test_snapshots_every_n_epochs_keep_the_newest_k(tmp_path, folder, capsys):
    argv = [*TINY, "--data-dir", str(folder), "--out-dir", str(tmp_path), "--name", "s", "--no-telemetry"]
    assert lktrain.main([*argv, "--epochs", "5", "--max-steps", "5", "--snapshot-every", "2", "--keep", "1"]) == 0
    run = tmp_path / "s"
    assert sorted(p.name for p in run.glob("epoch_*.pt")) == ["epoch_002.pt"] and not (run / "telemetry.jsonl").exists()
    raw = torch.load(run / "epoch_002.pt", weights_only=True)
    assert "optimizer" not in raw and raw["train"]["epoch"] == 2
    model, info = lkat_lens.load(run / "epoch_002.pt")
    assert info.model_name == "lkat_micro" and [m["epoch"] for m in info.metrics] == [1, 2]


def test_read_telemetry_skips_a_cut_last_line_and_refuses_a_broken_one(tmp_path):
    (tmp_path / "telemetry.jsonl").write_text('{"kind": "epoch", "epoch": 1}\n{"kind": "ep')
    assert read_telemetry(tmp_path) == [{"kind": "epoch", "epoch": 1}]
    (tmp_path / "telemetry.jsonl").write_text('{"kind": "ep\n{"kind": "epoch", "epoch": 1}\n')
    with pytest.raises(ValueError, match="telemetry.jsonl:1 is not a JSON record"):
        read_telemetry(tmp_path)
    with pytest.raises(FileNotFoundError, match="no telemetry"):
        read_telemetry(tmp_path / "nowhere")


def test_baselines_get_what_applies_to_them():
    torch.manual_seed(0)
    vit = create_model("vit_tiny_patch16_224", num_classes=3, img_size=32, patch_size=8, depth=2)
    mixer = create_model("mixer_s16_224", num_classes=3, img_size=32)
    images = torch.randn(2, 3, 32, 32)
    vit_blocks, mixer_blocks = measure(vit, images), measure(mixer, images)
    assert [sorted(b) for b in vit_blocks] == [
        ["block", "grad_norm", "outlier_patches", "resid_norm", "weight_norm"]
    ] * 2
    assert vit_blocks[1]["resid_norm"]["patches"] == pytest.approx(float(token_norms(vit, images).patches[2].mean()))
    assert {tuple(sorted(b)) for b in mixer_blocks} == {("block", "grad_norm", "weight_norm")}
    weights = torch.cat([p.detach().flatten().double() for p in mixer.blocks[1].parameters()])
    assert mixer_blocks[1]["weight_norm"] == pytest.approx(float(weights.norm()), rel=1e-9)
    assert mixer_blocks[1]["grad_norm"] is None
