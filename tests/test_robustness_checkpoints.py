"""Hostile and broken checkpoint files: refused by lkat_lens.load and the CLI with one clear message, never run."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import lkat_lens
import lkat_lens_cli as cli
from lkat_lens.checkpoint import FORMAT, CheckpointError, save_checkpoint

MICRO = dict(img_size=16, patch_size=4, embed_dim=64, depth=4, num_heads=2, num_classes=10)


@pytest.fixture(scope="module")
def micro_sd() -> dict[str, torch.Tensor]:
    """The state_dict of a seeded lkat_micro."""
    torch.manual_seed(0)
    return lkat_lens.create_model("lkat_micro", num_classes=10).state_dict()


def write_evil(path: Path, marker: Path) -> None:
    """A checkpoint-shaped pickle whose unpickling would create `marker`."""

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"format": FORMAT, "model": {"name": "lkat_micro"}, "state_dict": {}, "x": Payload()}, path)


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    """`python -m lkat_lens_cli ...` in a child process."""
    return subprocess.run([sys.executable, "-m", "lkat_lens_cli", *argv], capture_output=True, text=True, timeout=120)


def assert_one_line_exit_2(code: int, stderr: str, match: str) -> None:
    """Exit 2, one `lkat-lens: error:` line on stderr naming the problem, no traceback."""
    lines = stderr.strip().splitlines()
    assert code == 2, stderr
    assert len(lines) == 1 and lines[0].startswith("lkat-lens: error:") and match in lines[0], stderr
    assert "Traceback" not in stderr


COMMANDS = {  # every CLI command that opens a checkpoint, with the outputs it must not write
    "info": [],
    "analyze": ["--out", "{tmp}/r.json"],
    "figures": ["--out", "{tmp}/figs"],
    "explore": ["--port", "0"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_code_running_pickle_is_refused_by_the_cli(tmp_path, capsys, command):
    """Every command refuses it (exit 2, one line), runs nothing and writes nothing: `info` as `python -m
    lkat_lens_cli` in a child process (a fresh interpreter, the whole entry point), the others through cli.main here
    (each child pays the ~5 s import of timm)."""
    marker, path = tmp_path / "pwned", tmp_path / "evil.pt"
    write_evil(path, marker)
    argv = [command, str(path), *(a.format(tmp=tmp_path) for a in COMMANDS[command])]
    if command == "info":
        proc = run_cli(*argv)
        code, stderr = proc.returncode, proc.stderr
    else:
        code, stderr = cli.main(argv), capsys.readouterr().err
    assert_one_line_exit_2(code, stderr, "refusing to load")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.pt"]  # no marker, no report, no figures


def test_code_running_pickle_as_reference_state_dict_is_refused(tmp_path):
    """With --variant the file is still read weights-only: the payload never runs."""
    marker, path = tmp_path / "pwned", tmp_path / "evil.pth"
    write_evil(path, marker)
    with pytest.raises(CheckpointError, match="refusing to load"):
        lkat_lens.load(path, variant="lkat_micro")
    assert not marker.exists()


def _zip_not_checkpoint(path: Path, sd: dict) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hello")


def _random_bytes(path: Path, sd: dict) -> None:
    path.write_bytes(os.urandom(10_000))


def _legacy_format(path: Path, sd: dict) -> None:
    """torch's pre-1.6 raw-pickle format, which the weights-only reader does not take."""
    torch.save(
        {"format": FORMAT, "model": {"name": "lkat_micro"}, "state_dict": sd},
        path,
        _use_new_zipfile_serialization=False,
    )


def _truncated(path: Path, sd: dict) -> None:
    save_checkpoint(path, model_name="lkat_micro", model_kwargs={"num_classes": 10}, state_dict=sd)
    path.write_bytes(path.read_bytes()[:1000])


def _other_architecture(path: Path, sd: dict) -> None:
    """An rbfKAT (MHSA) state_dict labelled as lkat_micro."""
    torch.manual_seed(0)
    other = lkat_lens.create_model("rbfkat_tiny_patch16_224", **MICRO).state_dict()
    save_checkpoint(path, model_name="lkat_micro", model_kwargs={"num_classes": 10}, state_dict=other)


def _missing_keys(path: Path, sd: dict) -> None:
    part = {k: v for k, v in sd.items() if not k.startswith("blocks.3.")}
    save_checkpoint(path, model_name="lkat_micro", model_kwargs={"num_classes": 10}, state_dict=part)


def _unexpected_keys(path: Path, sd: dict) -> None:
    save_checkpoint(
        path, model_name="lkat_micro", model_kwargs={"num_classes": 10}, state_dict={**sd, "evil.weight": torch.ones(2)}
    )


def _wrong_shapes(path: Path, sd: dict) -> None:
    bad = {**sd, "pos_embed": torch.zeros(1, 7, 64)}
    save_checkpoint(path, model_name="lkat_micro", model_kwargs={"num_classes": 10}, state_dict=bad)


def _wrong_kwargs(path: Path, sd: dict) -> None:
    kwargs = {"num_classes": 10, "kan_basis": "bogus"}
    save_checkpoint(path, model_name="lkat_micro", model_kwargs=kwargs, state_dict=sd)


def _not_a_dict(path: Path, sd: dict) -> None:
    torch.save([torch.ones(3)], path)


def _future_format(path: Path, sd: dict) -> None:
    torch.save({"format": "lkat-lens/99", "model": {"name": "lkat_micro"}, "state_dict": sd}, path)


BROKEN = {
    "zip-not-checkpoint": (_zip_not_checkpoint, "not a readable torch checkpoint"),
    "random-bytes": (_random_bytes, "not a readable torch checkpoint"),
    "legacy-format": (_legacy_format, "not a zip archive"),
    "truncated": (_truncated, "truncated or corrupt"),
    "other-architecture": (_other_architecture, "missing keys"),
    "missing-keys": (_missing_keys, "missing keys (e.g. blocks.3."),
    "unexpected-keys": (_unexpected_keys, "1 unexpected keys (e.g. evil.weight)"),
    "wrong-shapes": (_wrong_shapes, "pos_embed: file (1, 7, 64) vs model (1, 21, 64)"),
    "wrong-kwargs": (_wrong_kwargs, "cannot build model 'lkat_micro'"),
    "not-a-dict": (_not_a_dict, "holds a list, not a checkpoint dict"),
    "future-format": (_future_format, "has format 'lkat-lens/99'"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_checkpoint_gives_one_clear_error(tmp_path, micro_sd, case):
    write, match = BROKEN[case]
    path = tmp_path / "ckpt.pt"
    write(path, micro_sd)
    with pytest.raises(CheckpointError) as err:
        lkat_lens.load(path)
    assert match in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", ["truncated", "other-architecture", "wrong-shapes", "zip-not-checkpoint"])
def test_cli_exits_2_with_one_line(tmp_path, micro_sd, capsys, case, command):
    write, match = BROKEN[case]
    path = tmp_path / "ckpt.pt"
    write(path, micro_sd)
    assert cli.main([command, str(path), *(a.format(tmp=tmp_path) for a in COMMANDS[command])]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("lkat-lens: error:") and match in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


def _damaged_copies(good: bytes, rng: random.Random, count: int):
    """Seeded damage to a real checkpoint: random bytes, random truncations and flipped bytes."""
    for i in range(count):
        kind = i % 3
        if kind == 0:
            yield rng.randbytes(rng.randrange(1, 20_000))
        elif kind == 1:
            yield good[: rng.randrange(1, len(good))]
        else:
            data = bytearray(good)
            for _ in range(rng.randrange(1, 8)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            yield bytes(data)


def test_damaged_checkpoints_never_escape_as_other_errors(tmp_path, micro_sd):
    """Fuzz: each damaged file either still loads or raises one single-line CheckpointError."""
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, model_name="lkat_micro", model_kwargs={"num_classes": 10}, state_dict=micro_sd)
    good, refused = path.read_bytes(), 0
    for data in _damaged_copies(good, random.Random(0), 300):
        path.write_bytes(data)
        try:
            lkat_lens.load(path)
        except CheckpointError as err:
            refused += 1
            assert "\n" not in str(err)
    assert refused >= 200  # every random and truncated file, at least
