"""Streamed statistics over images sharded across 2 gloo ranks equal the one-process result (1e-6 relative)."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from distributed_worker import NUM_IMAGES, streamed, worker
from local_server import free_port

import lkat_lens_cli
from lkat_lens.analyses import distributed_stats
from lkat_lens.analyses.serialize import json_ready
from lkat_lens.report import grid_span_report
from lkat_lens.study import Study

RTOL = 1e-6


def assert_same(got, want, where: str = "") -> None:
    """Tensors to RTOL relative (absolute tolerance scaled by the tensor's largest value); the rest equal."""
    if isinstance(want, torch.Tensor):
        if want.dtype.is_floating_point:
            finite = want[want.isfinite()]
            scale = float(finite.abs().max()) if finite.numel() else 1.0
            torch.testing.assert_close(got, want, rtol=RTOL, atol=RTOL * scale, msg=where)
        else:
            assert torch.equal(got, want), where
    elif dataclasses.is_dataclass(want):
        for field in dataclasses.fields(want):
            assert_same(getattr(got, field.name), getattr(want, field.name), f"{where}.{field.name}")
    elif isinstance(want, dict):
        assert set(got) == set(want), where
        for key in want:
            assert_same(got[key], want[key], f"{where}[{key}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=RTOL, abs=1e-12), where
    else:
        assert got == want, where


def test_two_gloo_ranks_stream_the_one_process_statistics(tmp_path):
    out = tmp_path / "ranks.pt"
    mp.spawn(worker, args=(free_port(), str(out)), nprocs=2, join=True)
    two = torch.load(out, weights_only=False)
    one = streamed(over_ranks=False)
    assert two["summary_images"] == one["summary_images"] == NUM_IMAGES
    assert two["tokens"].norms.shape[1] == NUM_IMAGES  # every image's norms, in one-process order
    assert next(iter(two["layers"].values())).count == NUM_IMAGES * 21  # 16 patches, 4 registers, 1 class token
    assert_same(two, one)


def test_shards_are_contiguous_and_cover_every_image():
    assert distributed_stats.shard_slice(13) == slice(0, 13)  # no process group: everything
    assert distributed_stats.rank_and_size() == (0, 1)


def numbers_close(got, want, where: str = "", rtol: float = RTOL) -> None:
    """Two JSON reports' sections: numbers to `rtol` relative, everything else equal."""
    if isinstance(want, dict):
        assert set(got) == set(want), where
        for key in want:
            numbers_close(got[key], want[key], f"{where}/{key}", rtol)
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            numbers_close(g, w, f"{where}[{i}]", rtol)
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=rtol, abs=1e-12), where
    else:
        assert got == want, where


def streamed_sections(study: Study) -> dict:
    """The report sections a sharded analyze combines over ranks, computed by one process (JSON-ready)."""
    one = {
        "edge_functions": study.edge_summary().to_dict(),
        "grid_span": grid_span_report(study),
        "gates": study.gate_statistics().to_dict(),
        "tokens": study.token_norms().to_dict(),
    }
    return json_ready(one)


def test_torchrun_analyze_writes_the_one_process_statistics(digits_checkpoint, tmp_path):
    out = tmp_path / "report.json"
    options = ["--device", "cpu", "--num-images", "32", "--batch-size", "8", "--probe-images", "20"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    command += ["-m", "lkat_lens_cli", "analyze", str(digits_checkpoint), *options, "--attribution-images", "1"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("wrote") == 1  # rank 0 alone writes
    two = json.loads(out.read_text())
    study = Study.open(digits_checkpoint, device="cpu", num_images=32, batch_size=8, progress=False)
    for key, section in streamed_sections(study).items():
        numbers_close(two[key], section, key)
    assert two["sample"]["images"] == 32 and two["sample"]["top1_percent"] == pytest.approx(study.sample_top1)
    assert {"attributions", "probes", "rollout"} <= set(two)  # rank 0 ran the rest


def test_torchrun_figures_writes_the_one_process_figures_once(digits_checkpoint, tmp_path):
    """figures under torchrun: both ranks draw, rank 0 alone writes, the same files as one process (whose numbers
    the statistics' own tests above compare)."""
    options = ["--device", "cpu", "--num-images", "16", "--batch-size", "4", "--format", "html", "--blocks", "0"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    command += ["-m", "lkat_lens_cli", "figures", str(digits_checkpoint), *options, "--overlay-images", "1"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run(
        [*command, "--out", str(tmp_path / "two")], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("wrote") == 1  # rank 0 alone writes
    one = lkat_lens_cli.main(
        ["figures", str(digits_checkpoint), *options, "--overlay-images", "1", "--out", str(tmp_path / "one")]
    )
    assert one == 0
    names = {path.name for path in (tmp_path / "one").iterdir()}
    assert {path.name for path in (tmp_path / "two").iterdir()} == names and "index.html" in names and len(names) > 10
