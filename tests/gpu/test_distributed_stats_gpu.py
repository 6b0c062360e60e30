"""`analyze` under torchrun on 2 GPUs (NCCL) writes the one-GPU streamed statistics (1e-5 relative)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_distributed_stats import numbers_close, streamed_sections

from lkat_lens.study import Study

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]


def test_torchrun_on_two_gpus_writes_the_one_gpu_statistics(digits_checkpoint, tmp_path):
    out = tmp_path / "report.json"
    options = ["--num-images", "256", "--batch-size", "32", "--probe-images", "32", "--attribution-images", "1"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    command += ["-m", "lkat_lens_cli", "analyze", str(digits_checkpoint), *options, "--out", str(out)]
    # the repository ahead of the path the process has (where the GPU image's carried packages, fla among them, are)
    path = [str(Path(__file__).parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    two = json.loads(out.read_text())
    study = Study.open(digits_checkpoint, device="cuda", num_images=256, batch_size=32, progress=False)
    for key, section in streamed_sections(study).items():
        numbers_close(two[key], section, key, rtol=1e-5)
    assert two["sample"]["top1_percent"] == pytest.approx(study.sample_top1)
