"""`lkat-lens evaluate` and `Study.map_evaluation` on a model trained on shapes through the real trainer."""

import json

import pytest
import torch
from benchmark_script import imported

import lkat_lens_cli
from lkat_lens.analyses import faithfulness
from lkat_lens.analyses.localisation import METRICS as LOCALISATION_METRICS
from lkat_lens.figures.faithfulness import evaluation_table_figure
from lkat_lens.study import Study


def test_evaluate_writes_the_table_and_figures(shapes_checkpoint, tmp_path, capsys):
    out = tmp_path / "eval"
    argv = ["evaluate", str(shapes_checkpoint), "--num-images", "4", "--mprt-images", "2", "--batch-size", "4"]
    argv += ["--methods", "saliency,rollout,random", "--format", "html", "--out", str(out), "--device", "cpu"]
    assert lkat_lens_cli.main(argv) == 0, capsys.readouterr().err
    report = json.loads((out / "evaluation.json").read_text())
    assert list(report["table"]) == ["saliency", "rollout", "random"]
    assert set(report["table"]["saliency"]) == set(faithfulness.METRICS)
    assert report["sample"]["images"] == 4 and report["sample"]["mprt_images"] == 2
    saliency = report["methods"]["saliency"]
    assert len(saliency["scores"]["relevance_mass"]) == 4 and len(saliency["mprt"]) == 4  # 4 blocks randomised
    assert report["methods"]["random"]["mprt_per_depth"] == [1.0] * 4  # noise ignores the weights
    for name in ("evaluation_table", "evaluation_perturbation", "evaluation_mprt"):
        assert (out / f"{name}.html").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "relevance_mass" in printed and "wrote" in printed


def test_user_errors_are_one_line(shapes_checkpoint, digits_checkpoint, capsys):
    assert lkat_lens_cli.main(["evaluate", str(digits_checkpoint), "--format", "html", "--device", "cpu"]) == 2
    assert "no object masks" in capsys.readouterr().err
    bad = ["evaluate", str(shapes_checkpoint), "--methods", "grad_cam", "--format", "html", "--device", "cpu"]
    assert lkat_lens_cli.main(bad) == 2
    assert "unknown method 'grad_cam'" in capsys.readouterr().err


def test_study_caches_the_evaluation_and_scores_one_image(shapes_checkpoint):
    study = Study.open(shapes_checkpoint, device="cpu", num_images=4, mprt_images=0)
    first = study.map_evaluation("input_x_gradient")
    assert study.map_evaluation("input_x_gradient") is first
    one = study.map_scores(2, "input_x_gradient")
    for name in (*LOCALISATION_METRICS, *faithfulness.FAITHFULNESS_METRICS):
        assert one[name] == pytest.approx(first.scores[name][2].item(), rel=1e-5, abs=1e-6, nan_ok=True), name
    labels = study.map_evaluation("rollout", explain="label")
    assert torch.equal(labels.target, study.sample.labels)
    with pytest.raises(ValueError, match="explain"):
        study.map_evaluation("rollout", explain="truth")


def test_table_figure_ranks_each_column():
    table = {"a": {"relevance_mass": 0.9, "positive_auc": 0.4}, "b": {"relevance_mass": 0.3, "positive_auc": 0.1}}
    heat = evaluation_table_figure(table).data[0]
    # relevance mass: higher is better (a best); positive AUC: lower is better (b best)
    assert heat.z == ((1.0, 0.0), (0.0, 1.0)) or [list(r) for r in heat.z] == [[1.0, 0.0], [0.0, 1.0]]
    assert [list(r) for r in heat.text] == [["0.900", "0.400"], ["0.300", "0.100"]]


@pytest.mark.slow
def test_a_model_trained_on_shapes_beats_chance_and_its_ig_beats_a_random_map(tmp_path):
    """16² lkat_micro (patch 4) trained through the real trainer for 400 steps on the CPU (benchmarks/e2e_shapes.py,
    which prints these numbers: about 2 min 40 s on this project's 2-core machine, hence slow): above 1.5x the 1/6
    chance (measured 31.3 %; 30.2 % with seed 1), and Integrated Gradients beats the noise map on the object masks:
    more positive relevance on the object, its maximum on the object more often, and the class probability falling
    faster as its top patches are removed."""
    with imported("e2e_shapes") as e2e:
        result = e2e.run(0, tmp_path)
    assert result["top1"] > 1.5 * 100 / 6  # chance is 1/6; the binomial sd of 96 images at 1/6 is 3.8 %
    ig, noise = result["integrated_gradients"], result["random"]
    # measured with seeds 0 / 1: mass 0.190 / 0.201 against 0.137 (the mask's area), pointing game 0.365 / 0.396
    # against 0.188, positive AUC 0.140 / 0.143 against 0.184
    assert ig["relevance_mass"] > 1.2 * noise["relevance_mass"]
    assert ig["pointing_game"] > noise["pointing_game"] + 0.1
    assert ig["positive_auc"] < noise["positive_auc"]
