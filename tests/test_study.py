"""The Study: one checkpoint, its parts, sample and defaults; results equal the analyses called directly, once each."""

from __future__ import annotations

import pytest
import torch
from tolerance import assert_close

import lkat_lens
from lkat_lens.analyses import attributions, edge_functions, gates, parts, tokens
from lkat_lens.checkpoint import CheckpointInfo, load
from lkat_lens.data import load_sample
from lkat_lens.study import Study, StudyDefaults, format_card, training_summary


@pytest.fixture(scope="module")
def study(digits_checkpoint) -> Study:
    return Study.open(digits_checkpoint, num_images=12, probe_images=24, attribution_images=2, edges=4)


def test_parts_come_from_the_model(study):
    model = study.model
    assert study.num_blocks == len(model.blocks) == 4 and study.num_heads == 2
    assert study.grid_size == (4, 4) and study.patch_size == (4, 4)
    assert study.has_kan and study.has_gates
    assert study.block_layers(2) == {"fc1": "blocks.2.mlp.fc1", "fc2": "blocks.2.mlp.fc2"}
    assert study.kan_layer(2, "fc2") is model.blocks[2].mlp.fc2
    assert parts.gla_blocks(model) == [0, 1, 2, 3] and parts.attention_kinds(model) == ["gla"] * 4


def test_sample_is_the_seeded_eval_sample(study, digits_checkpoint):
    info = load(digits_checkpoint)[1]
    want = load_sample(info.data, "val", 12)
    assert torch.equal(study.sample.images, want.images) and torch.equal(study.sample.labels, want.labels)
    assert len(study.probe_train.labels) == 24


def test_results_equal_the_analyses_called_directly(study):
    images = study.sample.images
    stats = edge_functions.layer_statistics(study.model, images)["blocks.1.mlp.fc1"]
    curves, scores, cached_stats = study.edge_curves(1, "fc1")
    assert_close(cached_stats.input_mean, stats.input_mean, rtol=0, atol=0)
    want_curves, want_scores = edge_functions.top_edge_curves(study.kan_layer(1, "fc1"), stats, 4)
    assert scores == want_scores and torch.equal(curves.values, want_curves.values)
    assert torch.equal(study.gate_statistics().log_alpha, gates.gate_statistics(study.model, images).log_alpha)
    assert torch.equal(study.token_norms().norms, tokens.token_norms(study.model, images).norms)
    direct = attributions.attribute(study.model, images[:1], "saliency")
    assert torch.equal(study.attribution(0, "saliency").pixel_map, direct.pixel_map)


def test_each_result_is_computed_once(study):
    first = study.edge_importance(0, "fc2")
    count = len(study.computed)
    assert study.edge_importance(0, "fc2") is first and len(study.computed) == count
    assert study.block_gates(3).blocks == [3] and study.block_gates(3).log_alpha.shape[0] == 1


def test_warm_up_runs_the_first_batch_and_caches_nothing(study):
    """warm_up is one forward of the sample's first batch (the batch size's images) and leaves no result behind."""
    seen = []
    handle = study.model.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[0]))
    computed, cached = list(study.computed), dict(study._cache)
    try:
        seconds = study.warm_up()
    finally:
        handle.remove()
    assert seen == [min(study.defaults.batch_size, len(study.sample.images))] and seconds > 0
    assert study.computed == computed and study._cache == cached


def test_a_checkpoint_without_data_is_refused(study):
    info = CheckpointInfo("ref.pth", "lkat_micro", {}, format="reference")
    with pytest.raises(ValueError, match="records no dataset"):
        Study(study.model, info)


def test_defaults_are_shared_and_overridable():
    assert StudyDefaults().settings("gradient_shap") == {"n_samples": 8}
    assert StudyDefaults().settings("saliency") == {}
    assert StudyDefaults(num_images=8).num_images == 8


def test_card_names_the_architecture_and_the_epoch(study):
    card = study.card()
    assert card["variant"] == "lkat_micro" and card["architecture"]["depth"] == 4
    assert card["architecture"]["KAN grid"] == "4 centres on [-2, 2]"
    text = format_card(card)
    assert "  KAN basis:  shared" in text and "\n" in text


def test_training_summary_says_which_epoch_of_how_many():
    metrics = [{"epoch": e, "val_top1": acc} for e, acc in [(1, 50.0), (2, 98.888888), (3, 97.5)]]
    info = CheckpointInfo("best.pt", "lkat_micro", {}, train={"args": {"epochs": 30}}, metrics=metrics[:2])
    summary = training_summary(info)
    assert summary["training"] == "epoch 2 of 30 (the best epoch so far)"
    assert summary["val top-1 (this epoch)"] == "98.89 %"
    info.metrics = metrics
    assert training_summary(info)["val top-1 (best so far)"] == "98.89 % (epoch 2)"


def test_a_model_without_class_token_is_analysed_without_class_token_maps(digits_checkpoint):
    """A reference cfg with use_cls_token: false: class-token maps are refused by name, the report leaves them out."""
    from lkat_lens import analyses
    from lkat_lens.report import analyze

    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_micro", num_classes=10, use_cls_token=False)
    info = load(digits_checkpoint)[1]
    study = Study(model, info, defaults=StudyDefaults(num_images=8, probe_images=16, attribution_images=1))
    assert not study.has_class_token
    with pytest.raises(ValueError, match="has no class token"):
        analyses.cls_attention(model, study.images(0))
    with pytest.raises(ValueError, match="has no class token"):
        analyses.attention_rollout(model, study.images(0))
    report = analyze(study, progress=False)
    assert "cls_attention" not in report and "rollout" not in report and "gates" in report


def test_the_explorer_offers_every_attribution_method(study):
    from lkat_lens.analyses.attributions import METHODS
    from lkat_lens.apps.views import attributions as view

    assert view.METHODS == METHODS and {"occlusion", "smoothgrad"} <= set(METHODS)
    for method in ("occlusion", "smoothgrad"):  # the two the explorer lacked run on one sample image
        found = study.attribution(0, method)
        assert found.patch_map.shape == (1, *study.grid_size) and bool(found.patch_map.abs().sum() > 0)


def test_small_batches_give_the_one_batch_results(study, digits_checkpoint):
    """Issue 15: the streaming statistics in batches of 5 (12 images: 3 batches) equal those of one batch."""
    small = Study.open(digits_checkpoint, num_images=12, edges=4, batch_size=5, device="cpu")
    assert small.defaults.batch_size == 5 and small.device == torch.device("cpu")
    one, streamed = study.layer_statistics(), small.layer_statistics()
    for name, stats in one.items():
        assert_close(streamed[name].input_mean, stats.input_mean)
        assert_close(streamed[name].output_std, stats.output_std)
        assert torch.equal(streamed[name].coverage.counts, stats.coverage.counts)
    assert_close(small.gate_statistics().log_alpha, study.gate_statistics().log_alpha)
    assert torch.equal(small.gate_statistics().log_alpha_quantiles, study.gate_statistics().log_alpha_quantiles)
    assert_close(small.token_norms().norms, study.token_norms().norms)
    assert small.span_shares() == pytest.approx(study.span_shares(), rel=1e-6)
    assert small.sample_top1 == study.sample_top1


def test_a_device_this_machine_lacks_is_refused(digits_checkpoint):
    with pytest.raises(ValueError, match="unknown device 'tpu9'"):
        Study.open(digits_checkpoint, device="tpu9")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            Study.open(digits_checkpoint, device="cuda")
