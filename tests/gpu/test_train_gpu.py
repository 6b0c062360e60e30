"""The trainer on CUDA: LKAT-T at 224 in bf16 through fla and Triton, --compile, and 2-GPU DDP vs 1 GPU."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lkat_lens import distributed as lkdist
from lkat_lens import train as lktrain

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def make_run(*argv: str | Path) -> lktrain.Run:
    """A trainer Run built from command-line words (str parts split on spaces)."""
    words = [a for p in argv for a in (p.split() if isinstance(p, str) else [str(p)])]
    args = lktrain.build_parser().parse_args(words)
    return lktrain.setup_run(args, lkdist.setup(args.device))


def test_lkat_tiny_224_trains_in_bf16(tmp_path):
    run = make_run(
        "--model lkat_tiny_patch16_224 --img-size 224 --batch-size 16 --max-steps 3 --device cuda",
        "--name t --out-dir",
        tmp_path,
    )
    assert run.amp_dtype is torch.bfloat16
    dtypes = []
    handle = run.model.blocks[0].attn.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    lktrain.train(run)
    handle.remove()
    assert dtypes and set(dtypes) == {torch.bfloat16}
    assert run.step == 3 and next(run.model.parameters()).dtype is torch.float32
    m = run.metrics[-1]
    assert math.isfinite(m["train_loss"]) and math.isfinite(m["val_loss"]) and m["max_mem_gb"] > 0
    assert (tmp_path / "t" / "last.pt").is_file()


def test_compile_trains(tmp_path):
    run = make_run("--batch-size 64 --max-steps 4 --compile --device cuda --name c --out-dir", tmp_path)
    lktrain.train(run)
    assert run.step == 4 and math.isfinite(run.metrics[-1]["train_loss"])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_match_one_gpu_after_20_steps(tmp_path):
    """Same global batch 64 (2 x 32 vs 1 x 64), no data randomness: losses agree to 1e-3 relative."""
    args = [
        *"-m lkat_lens.train --model lkat_tiny_patch16_224 --img-size 224 --recipe plain".split(),
        *"--batch-size 64 --epochs 1 --max-steps 20 --lr 3e-4 --warmup-epochs 0".split(),
        "--out-dir",
        str(tmp_path),
    ]
    single = subprocess.run(
        [sys.executable, *args, "--name", "one"], capture_output=True, text=True, timeout=600
    )
    assert single.returncode == 0, single.stderr
    torchrun = str(Path(sys.executable).parent / "torchrun")
    multi = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node=2", *args, "--name", "two"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert multi.returncode == 0, multi.stderr
    one = torch.load(tmp_path / "one" / "last.pt", weights_only=True)["metrics"][-1]
    two = torch.load(tmp_path / "two" / "last.pt", weights_only=True)["metrics"][-1]
    print(
        f"1 GPU: train_loss {one['train_loss']:.6f} val_loss {one['val_loss']:.6f}; "
        f"2 GPUs: train_loss {two['train_loss']:.6f} val_loss {two['val_loss']:.6f}"
    )
    assert one["step"] == two["step"] == 20
    assert two["train_loss"] == pytest.approx(one["train_loss"], rel=1e-3)
    assert two["val_loss"] == pytest.approx(one["val_loss"], rel=1e-3)
