"""`lkat-lens patch` (issue 17): JSON and figures from a real digits checkpoint; user errors exit 2 in one line."""

import json

import pytest

import lkat_lens_cli


def test_patch_writes_json_and_figures(digits_checkpoint, tmp_path, capsys):
    out = tmp_path / "iv"
    argv = ["patch", str(digits_checkpoint), "--clean", "2", "--corrupt", "5", "--out", str(out), "--format", "html"]
    assert lkat_lens_cli.main([*argv, "--points", "resid_pre,heads,gate,fc2", "--reference-images", "4"]) == 0
    report = json.loads((out / "interventions.json").read_text())
    assert report["clean"]["sample_image"] == 2 and report["corrupt"]["sample_image"] == 5
    assert set(report["patching"]) == {"resid_pre", "heads", "gate", "fc2"}
    resid = report["patching"]["resid_pre"]
    assert resid["axes"] == ["block", "position"] and len(resid["values"]) == 4 and len(resid["values"][0]) == 21
    assert report["patching"]["heads"]["axes"] == ["block", "head"]
    ablation = report["ablation"]
    assert ablation["methods"] == ["zero", "mean", "noise", "resample"] and ablation["reference_size"] == 4
    dla = report["logit_attribution"]
    assert abs(dla["logit"][0] - dla["model_logit"][0]) <= 1e-5 * max(1.0, abs(dla["model_logit"][0]))
    names = {p.name for p in out.iterdir()}
    assert {"patch_resid_pre.html", "patch_heads.html", "ablation_heads.html", "logit_attribution.html"} <= names
    assert "logit_lens.html" in names and "wrote" in capsys.readouterr().out


def test_patch_with_a_corruption_and_no_ablation(digits_checkpoint, tmp_path):
    out = tmp_path / "noise"
    argv = ["patch", str(digits_checkpoint), "--clean", "0", "--corrupt", "shuffle", "--points", "resid_post"]
    assert lkat_lens_cli.main([*argv, "--ablate", "none", "--out", str(out), "--format", "html", "--target", "3"]) == 0
    report = json.loads((out / "interventions.json").read_text())
    assert report["corrupt"] == {"corruption": "shuffle", "seed": 0} and report["ablation"] is None
    assert report["patching"]["resid_post"]["target"] == [3] and report["logit_attribution"]["target"] == [3]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--clean", "0", "--corrupt", "noise", "--points", "resid"], "--points 'resid': this model's points are"),
        (["--clean", "900", "--corrupt", "noise"], "sample image 900 out of range"),
        (["--clean", "0", "--corrupt", "noise", "--target", "10"], "class [10] out of range"),
        (["--clean", "missing.png", "--corrupt", "noise", "--ablate", "none"], "missing.png"),
        (["--clean", "0", "--corrupt", "noise", "--ablate", "gate", "--reference-images", "1"], "at least 2"),
    ],
)
def test_patch_user_errors_are_one_line(digits_checkpoint, tmp_path, capsys, extra, message):
    argv = ["patch", str(digits_checkpoint), "--out", str(tmp_path / "x"), "--format", "html", *extra]
    assert lkat_lens_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lkat-lens: error:") and message in err and "\n" not in err
