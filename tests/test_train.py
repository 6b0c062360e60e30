"""The trainer end to end on tiny data: every dataset format, checkpoints, exact resume, errors, fine-tuning, DDP."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_data import use_written_cifar, write_cifar, write_image_folder
from timm.layers import resample_abs_pos_embed
from tolerance import assert_close

import lkat_lens
from lkat_lens import create_model, seeding
from lkat_lens import data as lkdata
from lkat_lens import train as lktrain
from lkat_lens.telemetry_records import read_telemetry

MICRO = "--model lkat_micro --img-size 16 --threads 1"


pytestmark = pytest.mark.usefixtures("keep_torch_threads")


def train_cli(capsys, *parts: str | Path) -> tuple[int, str, str]:
    """Run `python -m lkat_lens.train` in this process (str parts split on spaces): (exit code, stdout, stderr)."""
    argv = [a for p in parts for a in (p.split() if isinstance(p, str) else [str(p)])]
    code = lktrain.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_no_arguments_means_lkat_micro_on_digits():
    cfg = lktrain.resolve_config(lktrain.build_parser().parse_args([]), None)
    assert (cfg.model, cfg.data, cfg.recipe, cfg.img_size) == ("lkat_micro", "digits", "digits", 16)
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.weight_decay, cfg.warmup_epochs) == (
        30,
        64,
        2e-3,
        0.05,
        2,
    )
    assert (cfg.workers, cfg.out_dir, cfg.seed, cfg.amp) == (0, "runs", 0, "auto")
    assert cfg.name.startswith("lkat_micro-digits-")


def test_image_datasets_default_to_deit_and_lkat_tiny():
    cfg = lktrain.resolve_config(lktrain.build_parser().parse_args(["--data", "cifar100"]), None)
    assert (cfg.model, cfg.recipe, cfg.img_size, cfg.epochs, cfg.batch_size, cfg.lr) == (
        "lkat_tiny_patch16_224",
        "deit",
        224,
        200,
        256,
        3e-4,
    )


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "imagefolder"])
def test_one_step_on_each_image_dataset(tmp_path, monkeypatch, capsys, folder, name):
    if name == "imagefolder":
        root, classes = folder, ["ant", "bee", "cow"]
    else:
        root = tmp_path / "data"
        classes = write_cifar(root, name, n_train=10, n_test=4, num_classes=10 if name == "cifar10" else 100)["classes"]
        use_written_cifar(monkeypatch, root, name)
    code, out, _ = train_cli(
        capsys,
        f"--data {name} --data-dir",
        root,
        MICRO,
        "--batch-size 4 --max-steps 1",
        "--out-dir",
        tmp_path,
        "--name r",
    )
    assert code == 0, out
    assert "epoch 1/" in out and "recipe deit" in out
    ckpt = torch.load(tmp_path / "r" / "last.pt", weights_only=True)
    assert ckpt["train"]["step"] == 1 and ckpt["train"]["epoch"] == 1
    assert ckpt["data"]["class_names"] == classes and ckpt["data"]["name"] == name
    assert ckpt["data"]["mean"] == list(lkdata.NORMALIZATION[name][0])
    assert ckpt["model"]["kwargs"]["num_classes"] == len(classes)


def test_checkpoint_opens_and_reproduces_its_validation_accuracy(tmp_path, capsys):
    code, out, _ = train_cli(
        capsys, "--epochs 1 --max-steps 3 --batch-size 32 --threads 1 --name digits --out-dir", tmp_path
    )
    assert code == 0
    run = tmp_path / "digits"
    raw = torch.load(run / "last.pt", weights_only=True)
    assert {"optimizer", "scheduler", "rng"} <= raw.keys()
    best = torch.load(run / "best.pt", weights_only=True)
    assert "optimizer" not in best and best["metrics"] == raw["metrics"]
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines == raw["metrics"] and len(lines) == 1
    assert set(lines[0]) >= {"epoch", "train_loss", "val_loss", "val_top1", "val_top5", "lr", "images_per_s", "time_s"}
    assert f"top1 {lines[0]['val_top1']:.2f}%" in out

    model, info = lkat_lens.load(run / "best.pt")
    assert info.model_name == "lkat_micro" and info.data["class_names"] == [str(d) for d in range(10)]
    assert info.data["img_size"] == 16 and info.data["in_chans"] == 3
    val = lkdata.build_dataset("digits", "val", transform=lkdata.eval_transform_for(info.data))
    images = torch.stack([val[i][0] for i in range(len(val))])
    with torch.no_grad():
        predicted = model(images).argmax(1)
    hits = (predicted == torch.tensor(val.targets)).sum().item()
    assert 100.0 * hits / len(val) == pytest.approx(lines[0]["val_top1"], abs=1e-9)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_continues_bit_identically(tmp_path, capsys, folder, workers):
    """2 epochs straight == 1 epoch, stop, --resume for the 2nd: DeiT aug, Mixup/CutMix, drop path and EMA."""
    common = [
        "--data imagefolder --data-dir",
        folder,
        MICRO,
        "--batch-size 4 --epochs 2 --drop-path 0.1 --ema",
        f"--ema-decay 0.9 --workers {workers} --seed 3 --out-dir",
        tmp_path,
    ]
    assert train_cli(capsys, *common, "--name straight")[0] == 0
    assert train_cli(capsys, *common, "--name split --max-steps 3")[0] == 0
    assert torch.load(tmp_path / "split" / "last.pt", weights_only=True)["train"]["epoch"] == 1
    code, out, _ = train_cli(capsys, "--resume", tmp_path / "split" / "last.pt", f"--workers {workers} --threads 1")
    assert code == 0 and "resuming after epoch 1" in out
    a = torch.load(tmp_path / "straight" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "last.pt", weights_only=True)
    assert a["train"]["step"] == b["train"]["step"] == 6
    for key in ("state_dict", "ema_state_dict"):
        assert a[key].keys() == b[key].keys()
        for name, tensor in a[key].items():
            assert torch.equal(tensor, b[key][name]), (key, name)
    for state_a, state_b in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True):
        assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    drop = ("time_s", "images_per_s")
    assert [{k: v for k, v in m.items() if k not in drop} for m in a["metrics"]] == [
        {k: v for k, v in m.items() if k not in drop} for m in b["metrics"]
    ]


def test_lagged_loss_reads_each_step_one_step_late_and_stops_at_a_non_finite_one():
    losses = lktrain.LaggedLoss(torch.device("cpu"), world_size=1)
    assert losses.push(torch.tensor(2.5), 1, 1) is None
    assert losses.push(torch.tensor(3.0, requires_grad=True) * 1, 1, 2) == 2.5
    assert losses.pop() == 3.0 and losses.pop() is None
    assert losses.push(torch.tensor(float("inf")), 2, 7) is None
    with pytest.raises(lktrain.NonFiniteLoss, match=r"\(inf\) at epoch 2, step 7"):
        losses.pop()


def test_non_finite_loss_stops_with_exit_2_and_keeps_last_checkpoint(tmp_path, capsys, folder):
    """One step per epoch; warmup covers step 0 only, then lr 1e30 blows the weights up and step 2's loss is NaN."""
    code, out, err = train_cli(
        capsys,
        "--data imagefolder --data-dir",
        folder,
        MICRO,
        "--recipe plain",
        "--batch-size 12 --epochs 3 --warmup-epochs 1 --lr 1e30 --name nan --out-dir",
        tmp_path,
    )
    assert code == 2
    assert "error: non-finite training loss (nan) at epoch 3, step 3" in err
    assert f"the last good checkpoint is {tmp_path / 'nan' / 'last.pt'} (epoch 2)" in err
    assert "Traceback" not in err and out.count("epoch 2/3 |") == 1
    assert torch.load(tmp_path / "nan" / "last.pt", weights_only=True)["train"]["epoch"] == 2
    assert len((tmp_path / "nan" / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("--model no_such_model", "cannot build model 'no_such_model'"),
        ("--model vit_tiny_patch16_224 --kan-basis edge", "cannot build model 'vit_tiny_patch16_224'"),
        ("--data cifar10 --data-dir {tmp}/missing", "cifar10 not found or corrupted under"),
        ("--data imagefolder --data-dir {tmp}", "imagefolder needs"),
        ("--resume {tmp}/nope.pt", "no checkpoint file at"),
        ("--finetune {tmp}/nope.pt", "no checkpoint file at"),
        ("--batch-size 5000", "--batch-size 5000 exceeds the 1437 training images"),
        ("--device tpu", "--device"),
        ("--epochs 0", "--epochs is out of range: 0"),
    ],
)
def test_user_errors_exit_2_with_one_message(tmp_path, capsys, argv, message):
    code, _, err = train_cli(capsys, argv.format(tmp=tmp_path), "--name x --out-dir", tmp_path)
    assert code == 2
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_odd_batch_per_rank_is_refused_under_mixup(tmp_path, capsys, folder):
    code, _, err = train_cli(capsys, "--data imagefolder --data-dir", folder, "--batch-size 3 --out-dir", tmp_path)
    assert code == 2 and "needs an even batch per rank, got 3" in err


def test_an_existing_run_is_not_overwritten(tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "last.pt").write_bytes(b"")
    code, _, err = train_cli(capsys, "--name taken --out-dir", tmp_path)
    assert code == 2 and f"--resume {tmp_path / 'taken' / 'last.pt'}" in err


def test_user_error_from_the_command_line_has_no_traceback(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "lkat_lens.train", "--model", "nope", "--out-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: cannot build model 'nope'") and "Traceback" not in proc.stderr


def test_finetune_loads_everything_but_the_head(tmp_path, capsys, folder):
    pre_run = train_cli(
        capsys,
        "--data imagefolder --data-dir",
        folder,
        MICRO,
        "--batch-size 4 --max-steps 1",
        "--name pre --out-dir",
        tmp_path,
    )
    assert pre_run[0] == 0
    pre = torch.load(tmp_path / "pre" / "last.pt", weights_only=True)
    model = create_model("lkat_micro", num_classes=7, img_size=16)
    lktrain.load_pretrained(model, pre, "pre")
    for name, tensor in model.state_dict().items():
        if not name.startswith("head."):
            assert torch.equal(tensor, pre["state_dict"][name]), name
    assert model.head.weight.shape == (7, 64)

    two = tmp_path / "two"
    write_image_folder(two, ["x", "y"], per_class=(4, 1), seed=1)
    code, out, _ = train_cli(
        capsys,
        "--finetune",
        tmp_path / "pre" / "last.pt",
        "--recipe finetune-a --data imagefolder",
        "--data-dir",
        two,
        "--batch-size 4 --max-steps 1 --threads 1 --name ft --out-dir",
        tmp_path,
    )
    assert code == 0 and "fine-tuning from" in out and "newly initialised: blocks.0.mlp.fc1.layernorm" in out
    ft = torch.load(tmp_path / "ft" / "last.pt", weights_only=True)
    kwargs = ft["model"]["kwargs"]
    assert (kwargs["num_classes"], kwargs["kan_layernorm"], kwargs["drop_path_rate"], kwargs["img_size"]) == (
        2,
        True,
        0.0,
        16,
    )
    assert ft["train"]["args"]["lr"] == 1e-4 and ft["data"]["class_names"] == ["x", "y"]


def test_reference_state_dict_fine_tunes_with_its_variant_named(tmp_path, capsys, folder):
    """A bare (reference-code style) state_dict needs --model; resuming from anything but a last.pt is refused."""
    torch.manual_seed(0)
    reference = create_model("lkat_micro", num_classes=5, img_size=16)
    torch.save({"model": {f"module.{k}": v for k, v in reference.state_dict().items()}}, tmp_path / "ref.pt")
    base = [
        "--data imagefolder --data-dir",
        folder,
        "--batch-size 4 --max-steps 1 --threads 1 --out-dir",
        tmp_path,
    ]
    code, _, err = train_cli(capsys, "--finetune", tmp_path / "ref.pt", *base, "--name a")
    assert code == 2 and "name the variant it was trained as with --model" in err
    code, out, _ = train_cli(capsys, "--finetune", tmp_path / "ref.pt", "--model lkat_micro", *base, "--name b")
    assert code == 0 and "fine-tuning from" in out
    code, _, err = train_cli(capsys, "--resume", tmp_path / "b" / "best.pt")
    assert code == 2 and "holds no training state to resume" in err


def test_fit_pos_embed_keeps_registers_and_class_token():
    small = create_model("lkat_micro", num_classes=10, img_size=16)  # 4x4 patches + 4 registers + class token
    large = create_model("lkat_micro", num_classes=10, img_size=32)  # 8x8 patches
    pe = torch.randn(1, 16 + 5, 64)
    pe[:, :16] = torch.linspace(-1, 1, 64)  # every patch position alike: resampling must keep it
    fitted = lktrain.fit_pos_embed(pe, large)
    assert fitted.shape == large.pos_embed.shape
    assert_close(fitted[:, :64], pe[:, :1].expand(1, 64, 64), atol=1e-5, rtol=0)
    assert torch.equal(fitted[:, 64:], pe[:, 16:])
    assert small.pos_embed.shape[1] == pe.shape[1]
    vit = create_model("vit_tiny_patch16_224", num_classes=10, img_size=32, patch_size=8, depth=1)  # class token first
    pe = torch.randn(1, 1 + 16, 192)
    bigger = create_model("vit_tiny_patch16_224", num_classes=10, img_size=48, patch_size=8, depth=1)
    fitted = lktrain.fit_pos_embed(pe, bigger)
    assert fitted.shape == (1, 1 + 36, 192) and torch.equal(fitted[:, :1], pe[:, :1])
    assert_close(fitted[:, 1:], resample_abs_pos_embed(pe[:, 1:], [6, 6], num_prefix_tokens=0))
    assert vit.pos_embed.shape == pe.shape


def test_rng_state_survives_a_weights_only_round_trip(tmp_path):
    seeding.seed_all(5)
    torch.save(seeding.rng_state(torch.device("cpu")), tmp_path / "rng.pt")
    first = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)], np.random.randn())
    seeding.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True), torch.device("cpu"))
    again = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)], np.random.randn())
    assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1])
    assert first[2] == again[2] and first[3] == again[3]


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
    reason="torchrun is not installed next to this python",
)
def test_two_process_ddp_matches_one_process(tmp_path, capsys, folder):
    """Global batch 8 as 2 gloo ranks x 4 on the CPU gives the single-process losses and weights."""
    args = [
        "--data imagefolder --data-dir",
        folder,
        MICRO,
        "--recipe plain --batch-size 8 --epochs 2",
        "--max-steps 2 --lr 1e-3 --device cpu --out-dir",
        tmp_path,
    ]
    assert train_cli(capsys, *args, "--name one")[0] == 0
    argv = [a for p in args for a in (p.split() if isinstance(p, str) else [str(p)])]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    multi = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node=2", "-m", "lkat_lens.train", *argv, "--name", "two"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert multi.returncode == 0, multi.stderr
    assert multi.stdout.count("epoch 1/2 |") == 1  # rank 0 alone logs
    assert [r["epoch"] for r in read_telemetry(tmp_path / "two")] == [1, 2]  # and writes telemetry once
    one = torch.load(tmp_path / "one" / "last.pt", weights_only=True)
    two = torch.load(tmp_path / "two" / "last.pt", weights_only=True)
    assert two["train"]["world_size"] == 2 and len(two["rng"]["ranks"]) == 2 and two["train"]["step"] == 2
    for m1, m2 in zip(one["metrics"], two["metrics"], strict=True):
        assert m2["train_loss"] == pytest.approx(m1["train_loss"], rel=1e-5)
        assert m2["val_loss"] == pytest.approx(m1["val_loss"], rel=1e-5)
        assert m2["val_top1"] == m1["val_top1"]
    for name, tensor in one["state_dict"].items():
        assert_close(two["state_dict"][name], tensor, rtol=1e-5, atol=1e-6)


def test_dropout_flags_reach_the_model_and_its_checkpoint(tmp_path, capsys):
    code, out, _ = train_cli(
        capsys, "--drop 0.1 --attn-drop 0.2 --max-steps 1 --batch-size 32 --threads 1 --name d --out-dir", tmp_path
    )
    assert code == 0, out
    model, info = lkat_lens.load(tmp_path / "d" / "last.pt")
    assert (info.model_kwargs["drop_rate"], info.model_kwargs["attn_drop_rate"]) == (0.1, 0.2)
    assert {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)} == {0.1, 0.2}
