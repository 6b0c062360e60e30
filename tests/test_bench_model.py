"""benchmarks/bench_model.py --compare: queued steps timed beside synchronised ones, and their ratios to ViT."""

from __future__ import annotations

import argparse
import time

import pytest
import torch
from benchmark_script import imported

import lkat_lens
from lkat_lens.flat_params import FlatParameters


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


def test_compare_ratios_to_the_vit_with_lkats_patch_matmul(bench) -> None:
    """`*_x_vit` stays against timm's ViT as it ships; `*_x_vit_matmul` is against the ViT given LKAT's patch
    embedding, whichever order the rows come in."""
    matmul_vit = _row("vit_tiny_patch16_224", 120.0, 150.0, 500.0, 640.0) | {"patch_embed": "matmul"}
    rows = [
        matmul_vit,
        _row("vit_tiny_patch16_224", 100.0, 125.0, 400.0, 500.0),
        _row("lkat_tiny_patch16_224", 60, 75, 200, 320),
    ]
    bench.compare_ratios(rows)
    lkat = rows[2]
    assert lkat["train_x_vit"] == pytest.approx(0.6) and lkat["train_x_vit_matmul"] == pytest.approx(0.5)
    assert lkat["train_pipelined_x_vit_matmul"] == pytest.approx(0.5)
    assert lkat["infer_pipelined_x_vit"] == pytest.approx(0.64) and lkat[
        "infer_pipelined_x_vit_matmul"
    ] == pytest.approx(0.5)


def test_compared_models_add_a_vit_with_lkats_patch_embedding(bench) -> None:
    """--vit-patch-embed timm matmul: timm's ViT-S, a ViT-S built with LKAT's PatchEmbed (the same parameters), then
    LKAT-S."""
    models = bench.compared_models("small", tiny=False, vit_patch_embeds=["timm", "matmul"])
    assert [(label, name, embed) for label, name, _, embed in models] == [
        ("ViT-S", "vit_small_patch16_224", "timm"),
        ("ViT-S patch matmul", "vit_small_patch16_224", "matmul"),
        ("LKAT-S", "lkat_small_patch16_224", "matmul"),
    ]
    timm_vit, matmul_vit = (
        bench.timm.create_model(name, pretrained=False, **kwargs) for _, name, kwargs, _ in models[:2]
    )
    assert type(matmul_vit.patch_embed) is bench.PatchEmbed
    assert type(timm_vit.patch_embed) is not bench.PatchEmbed
    assert {k: v.shape for k, v in matmul_vit.state_dict().items()} == {
        k: v.shape for k, v in timm_vit.state_dict().items()
    }


@pytest.mark.parametrize(("path", "word"), [("gla_gate", "gate"), ("gla_core", "core")])
def test_compare_varies_each_path_around_the_gla(bench, path: str, word: str) -> None:
    """--gla-gate (or --gla-core) auto torch, the other paths left "auto", gives one ViT row and two LKAT rows, the
    second labelled and configured with that path's modules."""
    paths = {name: ["auto"] for name in ("gla_input", "gla_output", "gla_gate", "gla_core")} | {path: ["auto", "torch"]}
    args = argparse.Namespace(
        tiny=True, vit_patch_embed=["timm"], attn=["auto"], kan=["auto"], memory_budgets=[1.0], **paths
    )
    rows = bench.compared_variants("tiny", args)
    lkat = [(label, backends) for label, name, _, backends, _, _ in rows if name.startswith("lkat")]
    assert len(rows) == 3 and [label.endswith(f" torch {word}") for label, _ in lkat] == [False, True], rows
    assert [backends[path] for _, backends in lkat] == ["auto", "torch"]
    assert all(backends[other] == "auto" for _, backends in lkat for other in paths if other != path)


@pytest.mark.parametrize("training", [True, False])
def test_tune_kernels_leaves_the_model_as_it_found_it(bench, training: bool) -> None:
    """--tune-first's eager step and inference leave no gradient behind and the model in the mode it was in, and the
    parameters untouched (no optimizer step)."""
    model = lkat_lens.create_model("lkat_micro", num_classes=10).train(training)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randn(2, 3, 16, 16), torch.tensor([1, 7])
    bench.tune_kernels(model, x, y)
    assert model.training is training and all(m.training is training for m in model.modules())
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))


def test_idle_gaps_are_the_uncovered_spans_longest_first() -> None:
    """profile_step.idle_gaps: the spans of [start, end) that no (overlapping, unsorted) interval covers, the
    longest first, the first `top` of them."""
    with imported("profile_step") as profile:
        intervals = [(4.5, 7.0), (1.0, 2.0), (4.0, 5.0)]
        assert profile.idle_gaps(intervals, 0.0, 10.0) == [(7.0, 10.0), (2.0, 4.0), (0.0, 1.0)]
        assert profile.idle_gaps(intervals, 0.0, 10.0, top=1) == [(7.0, 10.0)]
        assert profile.idle_gaps([(0.0, 3.0)], 0.0, 3.0) == []


def test_training_run_steps_the_optimizer_and_infers_without_gradients(bench) -> None:
    """The set-up --compare and host_timeline.py share: a training step moves every parameter (fused AdamW on CUDA,
    plain here), and inference leaves no gradient."""
    run = bench.training_run("lkat_micro", "eager", "cpu", batch=2, img=16)
    assert run.x.shape == (2, 3, 16, 16) and isinstance(run.model, lkat_lens.models.LKAT)
    before = [p.detach().clone() for p in run.model.parameters()]
    run.train_step()
    moved = [not torch.equal(p, b) for p, b in zip(run.model.parameters(), before, strict=True)]
    assert all(moved) and all(p.grad is None for p in run.model.parameters())
    run.infer()
    assert all(p.grad is None for p in run.model.parameters())


def test_host_timeline_phases_run_from_stamp_to_stamp() -> None:
    """host_timeline.phases_ms by hand: each phase from the stamp that ends the one before (or the start) to the first
    stamp that ends it, the last to the step's end; in ms."""
    stamps = [
        ("Tensor.backward", 1.0),
        ("Tensor.backward returned", 2.5),
        ("optimizer.step", 3.0),
        ("optimizer.step returned", 4.0),
        ("optimizer.zero_grad", 4.5),
        ("optimizer.zero_grad returned", 5.0),
    ]
    with imported("host_timeline") as timeline:
        phases = timeline.phases_ms(stamps, 0.5, 6.0)
    expected = {"forward": 500.0, "backward": 2000.0, "optimizer": 1500.0, "zero_grad": 500.0, "device": 1000.0}
    assert phases == pytest.approx({**expected, "step": 5500.0}, rel=1e-12)


def test_host_timeline_stamps_a_real_steps_phases(bench, monkeypatch) -> None:
    """The stamps host_timeline wraps around a training step (Tensor.backward, the optimizer's step and zero_grad)
    are all made in an eager lkat_micro step, in order, and its phases add up to the step."""
    monkeypatch.setattr(torch.Tensor, "backward", torch.Tensor.backward)  # restored after the test
    with imported("host_timeline") as timeline:
        run = bench.training_run("lkat_micro", "eager", "cpu", batch=2, img=16, flat=True)
        timeline.stamping(torch.Tensor, "backward", "Tensor.backward")
        timeline.stamp_optimizer(run.optimizer)
        timeline.stamps.clear()
        start = time.perf_counter()
        run.train_step()
        end = time.perf_counter()
        labels = [label for label, _ in timeline.stamps]
        phases = timeline.phases_ms(timeline.stamps, start, end)
    assert [label for label in labels if label in timeline.PHASE_ENDS] == list(timeline.PHASE_ENDS)
    assert all(phases[phase] >= 0 for phase in timeline.PHASES)
    assert sum(phases[phase] for phase in timeline.PHASES) == pytest.approx(phases["step"], rel=1e-9)
    assert isinstance(run.net, FlatParameters) and run.net.module is run.model
