"""Interrupted and failing checkpoint writes in the trainer: SIGKILL mid-write and disk-full keep what was saved.

A non-finite loss is covered by tests/test_train.py::test_non_finite_loss_stops_with_exit_2_and_keeps_last_checkpoint.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import lkat_lens
from lkat_lens import train as lktrain
from lkat_lens.telemetry_records import read_telemetry

pytestmark = pytest.mark.usefixtures("keep_torch_threads")  # main() sets torch's thread count for the process

ARGS = "--model lkat_micro --img-size 16 --epochs 2 --batch-size 4 --threads 1 --name run --data imagefolder".split()

# Runs the trainer with torch.save patched: the write of epoch 2's last.pt puts half a file on disk,
# announces itself by creating WRITING and then hangs until the parent kills the process.
HANGING_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import lkat_lens.checkpoint as ck
    from lkat_lens import train

    real_save = ck.torch.save

    def save(obj, f):
        if obj["train"]["epoch"] == 2 and "optimizer" in obj:  # last.pt (best.pt has no optimizer)
            f.write(b"PK\\x03\\x04 half a checkpoint")
            f.flush()
            Path(sys.argv[1]).touch()
            time.sleep(600)
        real_save(obj, f)

    ck.torch.save = save
    sys.exit(train.main(sys.argv[2:]))
    """
)


def test_sigkill_during_checkpoint_write_keeps_previous_and_resume_continues(tmp_path, capsys, folder):
    flag = tmp_path / "WRITING"
    proc = subprocess.Popen(
        [sys.executable, "-c", HANGING_WRITER, str(flag), *ARGS, "--data-dir", str(folder), "--out-dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not flag.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    run = tmp_path / "run"
    leftovers = [p.name for p in run.iterdir() if p.name.startswith(".last.pt.")]
    assert len(leftovers) == 1  # the killed temp file stays behind under a hidden name; last.pt is untouched
    model, info = lkat_lens.load(run / "last.pt")
    assert info.train["epoch"] == 1 and len(info.metrics) == 1
    assert [r["epoch"] for r in read_telemetry(run)] == [1, 2]  # epoch 2's record precedes its last.pt
    assert lktrain.main(["--resume", str(run / "last.pt"), "--threads", "1"]) == 0
    assert "resuming after epoch 1" in capsys.readouterr().out
    _, info = lkat_lens.load(run / "last.pt")
    assert info.train["epoch"] == 2 and [m["epoch"] for m in info.metrics] == [1, 2]
    assert [r["epoch"] for r in read_telemetry(run)] == [1, 2]  # one line per epoch: no gap, no duplicate


def test_disk_full_during_save_loses_nothing_already_saved(tmp_path, monkeypatch, capsys, folder):
    real_save = torch.save

    def save(obj, f):
        if obj["train"]["epoch"] == 2:
            f.write(b"partial")
            raise OSError(28, "No space left on device")
        real_save(obj, f)

    assert lktrain.main([*ARGS, "--max-steps", "3", "--data-dir", str(folder), "--out-dir", str(tmp_path)]) == 0
    run = tmp_path / "run"
    written = {p.name: p.read_bytes() for p in run.iterdir()}
    monkeypatch.setattr("lkat_lens.checkpoint.torch.save", save)
    capsys.readouterr()
    assert lktrain.main(["--resume", str(run / "last.pt"), "--epochs", "2", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "intact" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == written  # no temp file, every byte kept
    _, info = lkat_lens.load(run / "last.pt")
    assert info.train["epoch"] == 1
    assert lkat_lens.load(run / "best.pt")[1].train["epoch"] == 1
    monkeypatch.undo()  # space is back: the run resumes from what was kept
    assert lktrain.main(["--resume", str(run / "last.pt"), "--threads", "1"]) == 0
    assert lkat_lens.load(run / "last.pt")[1].train["epoch"] == 2


def test_sigkill_at_random_moments_always_leaves_a_loadable_last_checkpoint(tmp_path, folder):
    """Runs killed at random moments after their first checkpoint: last.pt always loads and resumes."""
    rng = random.Random(0)
    args = [*ARGS, "--epochs", "50", "--data-dir", str(folder), "--out-dir", str(tmp_path)]
    last = tmp_path / "run" / "last.pt"
    for _ in range(3):
        argv = ["--resume", str(last), "--threads", "1"] if last.exists() else args
        proc = subprocess.Popen([sys.executable, "-m", "lkat_lens.train", *argv], stdout=subprocess.DEVNULL)
        start = last.stat().st_mtime_ns if last.exists() else 0
        deadline = time.monotonic() + 120
        while not (last.exists() and last.stat().st_mtime_ns > start):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        _, info = lkat_lens.load(last)
        assert info.train["epoch"] >= 1 and len(info.metrics) == info.train["epoch"]
