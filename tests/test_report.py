"""`lkat-lens analyze` and `lkat-lens info` on a real digits checkpoint."""

import json
import subprocess
import sys

import lkat_lens_cli as cli
from lkat_lens.checkpoint import load

SECTIONS = {"edge_functions", "gates", "cls_attention", "rollout", "tokens", "attributions", "probes", "grid_span"}


def strict_json(path):
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_analyze_writes_every_analysis(digits_checkpoint, tmp_path, capsys):
    out = tmp_path / "report.json"
    argv = [
        str(digits_checkpoint),
        "--num-images",
        "16",
        "--probe-images",
        "48",
        "--attribution-images",
        "2",
        "--out",
        str(out),
        "--progress",  # capsys is no terminal: the bars are off unless asked for
    ]
    assert cli.main(["analyze", *argv]) == 0
    report = strict_json(out)
    assert SECTIONS <= set(report)
    depth = 4
    assert report["model"]["variant"] == "lkat_micro" and report["sample"]["images"] == 16
    assert report["model"]["architecture"]["depth"] == depth and report["model"]["architecture"]["KAN basis"]
    assert 0.0 <= report["sample"]["top1_percent"] <= 100.0
    assert len(report["edge_functions"]["layers"]) == 2 * depth
    assert report["gates"]["blocks"] == list(range(depth))
    assert len(report["probes"]["test_accuracy"]["cls"]) == depth + 1
    assert report["probes"]["num_test"] == 16 and report["probes"]["num_train"] == 48
    ig = report["attributions"]["integrated_gradients"]  # convergence per image, and whether the 5 % rule holds
    assert len(ig["delta_ratio"]) == 2 and isinstance(ig["converged"], bool) and ig["steps"] >= 32
    faith = report["attributions"]["faithfulness"]
    assert len(faith["deletion_auc"]) == 2 and all(0.0 <= a <= 1.0 for a in faith["deletion_auc"])
    assert len(report["tokens"]["mean_norm"]["patches"]) == depth + 1
    printed = capsys.readouterr()
    assert "wrote" in printed.out
    steps = ["loading the data sample", "KAN edge functions", "GLA forget gates", "class-token attention"]
    steps += ["gradient rollout", "token norms", "Integrated Gradients", "linear probes", "grid span"]
    assert all(step in printed.err for step in steps), printed.err[-2000:]  # the progress bar names every step
    top = report["edge_functions"]["layers"]["blocks.0.mlp.fc1"]["top_edges"][0]
    assert set(top) == {"out", "in", "std"} and top["std"] > 0
    assert "majority-class" in report["probes"]["chance_rule"] and "tokens" in report["gates"]["half_life_unit"]
    spans = report["grid_span"]  # the share of the grid each KAN layer's inputs occupy, slivers flagged
    assert set(spans) == set(report["edge_functions"]["layers"])
    assert all(0.0 <= s["occupied_share"] <= 1.0 and s["sliver"] == (s["occupied_share"] < 0.1) for s in spans.values())


def test_info_prints_the_model_card(digits_checkpoint, capsys):
    assert cli.main(["info", str(digits_checkpoint)]) == 0
    lines = capsys.readouterr().out.splitlines()
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in lines)}
    assert fields["variant"] == "lkat_micro" and fields["dataset"] == "digits"
    assert fields["depth"] == "4" and fields["width"] == "64" and fields["heads"] == "2"
    assert fields["KAN basis"] == "shared" and "centres on" in fields["KAN grid"]
    epochs = load(digits_checkpoint)[1].train["args"]["epochs"]
    assert fields["training"].startswith("epoch ") and fields["training"].split(" of ")[1].startswith(str(epochs))
    assert fields["val top-1 (this epoch)"].endswith(" %")


def test_bad_checkpoint_exits_2_with_one_line(tmp_path):
    """`analyze` in a child process (test_robustness_checkpoints runs `info` in one, the others in the test process)."""
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    done = subprocess.run([sys.executable, "-m", "lkat_lens_cli", "analyze", str(bad)], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "not a readable torch checkpoint" in done.stderr
    assert "Traceback" not in done.stderr
