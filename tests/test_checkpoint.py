"""Checkpoint I/O: format, atomic writes, safe loading, reference-code state_dicts."""

import os

import pytest
import torch

import lkat_lens
from lkat_lens.checkpoint import FORMAT, CheckpointError, load, save_checkpoint


def reference_lkat_state_dict(dim=192, depth=12, heads=3, grids=4, classes=1000, img=224, patch=16, regs=4):
    """Keys and shapes of the reference repository's LKAT (models/LKAT.py + fla's GatedLinearAttention)."""
    g = torch.Generator().manual_seed(0)
    n, dh, hidden = (img // patch) ** 2, dim // heads, 4 * dim
    shapes = {
        "cls_token": (1, 1, dim),
        "register_tokens": (1, regs, dim),
        "pos_embed": (1, n + regs + 1, dim),
        "patch_embed.proj.weight": (dim, 3, patch, patch),
        "patch_embed.proj.bias": (dim,),
        "norm.weight": (dim,),
        "norm.bias": (dim,),
        "head.weight": (classes, dim),
        "head.bias": (classes,),
    }
    for i in range(depth):
        b = f"blocks.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "g_proj", "o_proj"):
            shapes[b + f"attn.{proj}.weight"] = (dim, dim)
        for conv in ("q_conv1d", "k_conv1d", "v_conv1d"):
            shapes[b + f"attn.{conv}.weight"] = (dim, 1, 4)
        shapes |= {
            b + "attn.gk_proj.0.weight": (16, dim),
            b + "attn.gk_proj.1.weight": (dim, 16),
            b + "attn.gk_proj.1.bias": (dim,),
            b + "attn.q_norm.weight": (dh,),
            b + "attn.k_norm.weight": (dh,),
            b + "attn.g_norm.weight": (dh,),
            b + "attn.g_norm.bias": (dh,),
        }
        for norm in ("norm1", "norm2"):
            shapes |= {b + f"{norm}.weight": (dim,), b + f"{norm}.bias": (dim,)}
        for fc, (i_, o_) in (("fc1", (dim, hidden)), ("fc2", (hidden, dim))):
            shapes |= {b + f"mlp.{fc}.grid_linear.weight": (1, grids), b + f"mlp.{fc}.dim_linear.weight": (o_, i_)}
    sd = {k: torch.randn(s, generator=g) * 0.02 for k, s in shapes.items()}
    for i in range(depth):
        for fc in ("fc1", "fc2"):
            sd[f"blocks.{i}.mlp.{fc}.rbf.grid"] = torch.linspace(-2, 2, grids)
    return sd


@pytest.fixture(scope="module")
def micro():
    torch.manual_seed(0)
    return lkat_lens.create_model("lkat_micro", num_classes=10).eval()


def save_micro(model, path, **extra):
    save_checkpoint(
        path,
        model_name="lkat_micro",
        model_kwargs={"num_classes": 10},
        state_dict=model.state_dict(),
        data={"name": "digits", "class_names": [str(i) for i in range(10)]},
        train={"epoch": 3},
        metrics=[{"epoch": 0, "val_top1": 0.5}],
        **extra,
    )


def test_roundtrip_and_weights_only(tmp_path, micro):
    path = tmp_path / "ckpt.pt"
    save_micro(micro, path, optimizer={"state": {}, "param_groups": []})
    raw = torch.load(path, weights_only=True)
    assert raw["format"] == FORMAT and raw["model"]["name"] == "lkat_micro" and "optimizer" in raw
    model, info = lkat_lens.load(path)
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(model(x), micro(x))
    assert info.data["name"] == "digits" and info.train["epoch"] == 3 and info.metrics[0]["val_top1"] == 0.5
    assert not model.training
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temp file left behind


def test_failed_write_keeps_previous_checkpoint(tmp_path, micro, monkeypatch):
    """A write that dies half-way (e.g. disk full) leaves the previous file intact and no temp file."""
    path = tmp_path / "ckpt.pt"
    save_micro(micro, path)
    before = path.read_bytes()

    def disk_full(obj, f):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("lkat_lens.checkpoint.torch.save", disk_full)
    with pytest.raises(OSError, match="No space"):
        save_micro(micro, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "model": {"name": "lkat_micro"}, "state_dict": {}, "x": Payload()}, path)
    with pytest.raises(CheckpointError, match="refusing to load"):
        lkat_lens.load(path)
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"\x00" * 100, os.urandom(4096)])
def test_garbage_files_give_one_clear_error(tmp_path, content):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="not a readable torch checkpoint|refusing"):
        lkat_lens.load(path)


def test_truncated_checkpoint(tmp_path, micro):
    path = tmp_path / "ckpt.pt"
    save_micro(micro, path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        lkat_lens.load(path)


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint file"):
        lkat_lens.load(tmp_path / "nope.pt")


def test_wrong_shapes_and_keys_are_named(tmp_path, micro):
    sd = dict(micro.state_dict())
    sd["head.weight"] = torch.zeros(3, 64)
    del sd["norm.bias"]
    sd["extra.weight"] = torch.zeros(1)
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, model_name="lkat_micro", model_kwargs={"num_classes": 10}, state_dict=sd)
    with pytest.raises(CheckpointError) as err:
        lkat_lens.load(path)
    message = str(err.value)
    assert "norm.bias" in message and "extra.weight" in message and "head.weight: file (3, 64)" in message


def test_unknown_model_name(tmp_path, micro):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, model_name="not_a_model", model_kwargs={}, state_dict=micro.state_dict())
    with pytest.raises(CheckpointError, match="not_a_model"):
        lkat_lens.load(path)


def test_plain_pickle_of_state_dict_needs_variant(tmp_path, micro):
    path = tmp_path / "sd.pt"
    torch.save(micro.state_dict(), path)
    with pytest.raises(CheckpointError, match="variant"):
        lkat_lens.load(path)
    model, info = lkat_lens.load(path, variant="lkat_micro")
    assert info.format == "reference" and info.model_kwargs["img_size"] == 16
    x = torch.randn(1, 3, 16, 16)
    assert torch.equal(model(x), micro(x))


@pytest.mark.parametrize("wrap", ["bare", "model", "ddp"])
def test_reference_lkat_tiny_state_dict_loads_strictly(tmp_path, wrap):
    sd = reference_lkat_state_dict()
    if wrap == "ddp":
        sd = {"module." + k: v for k, v in sd.items()}
    obj = {"model": sd, "epoch": 299, "best_acc": 81.0} if wrap == "model" else sd
    path = tmp_path / "reference.pth"
    with open(path, "wb") as f:
        torch.save(obj, f)
    model, info = load(path, variant="lkat_tiny_patch16_224")
    assert info.model_kwargs["num_classes"] == 1000 and info.model_kwargs["img_size"] == 224
    assert set(model.state_dict()) == set(reference_lkat_state_dict())
    logits = model(torch.randn(1, 3, 224, 224))
    assert logits.shape == (1, 1000) and torch.isfinite(logits).all()


def test_save_removes_temp_files_left_by_a_killed_writer(tmp_path, micro):
    stale = tmp_path / ".ckpt.pt.k1ll3d.tmp"
    stale.write_bytes(b"half a checkpoint")
    save_micro(micro, tmp_path / "ckpt.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]
