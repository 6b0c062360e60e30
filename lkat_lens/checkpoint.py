"""Checkpoint files: atomic writes of plain containers, safe loading, reference-code state_dicts."""

from __future__ import annotations

import math
import os
import pickle
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

FORMAT = "lkat-lens/1"
_REQUIRED = ("format", "model", "state_dict")
_WRAPPER_KEYS = ("state_dict", "model", "model_state_dict", "module")
_NAME_PREFIXES = ("module.", "_orig_mod.")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the model; the message says why."""


@dataclass
class CheckpointInfo:
    """What a checkpoint says about itself besides the weights."""

    path: str
    model_name: str
    model_kwargs: dict[str, Any]
    data: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    format: str = FORMAT
    provenance: dict[str, str] = field(default_factory=dict)  # model_name / kwarg / data field -> where it came from


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save to a temp file in the same folder, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a writer that was killed mid-save
        stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_checkpoint(
    path: str | os.PathLike,
    *,
    model_name: str,
    model_kwargs: dict[str, Any],
    state_dict: dict[str, torch.Tensor],
    data: dict[str, Any] | None = None,
    train: dict[str, Any] | None = None,
    metrics: list[dict[str, Any]] | None = None,
    **resume_state: Any,
) -> None:
    """Write an lkat-lens checkpoint atomically; `resume_state` holds optimizer/scheduler/scaler/rng/ema."""
    payload = {
        "format": FORMAT,
        "model": {"name": model_name, "kwargs": dict(model_kwargs)},
        "state_dict": {k: v.detach().cpu() for k, v in state_dict.items()},
        "data": dict(data or {}),
        "train": dict(train or {}),
        "metrics": list(metrics or []),
        **{k: v for k, v in resume_state.items() if v is not None},
    }
    atomic_save(payload, path)


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a checkpoint file without ever unpickling arbitrary objects."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint file at {path}")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            _unreadable(path, "not a zip archive (torch.save has written zip archives since torch 1.6)")
        )
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        detail = _unpickler_detail(str(err))
        if "global" not in detail.lower():
            raise CheckpointError(_unreadable(path, detail)) from None
        raise CheckpointError(
            f"refusing to load {path}: it holds Python objects other than tensors and plain containers "
            f"({detail}); only weights-only checkpoints are loaded, since such a file may run code when unpickled"
        ) from None
    except Exception as err:  # a damaged archive can fail anywhere inside torch's reader
        raise CheckpointError(_unreadable(path, f"{type(err).__name__}: {err}".splitlines()[0])) from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path} holds a {type(obj).__name__}, not a checkpoint dict")
    return obj


def _unreadable(path: Path, detail: object) -> str:
    return f"{path} is not a readable torch checkpoint (truncated or corrupt?): {detail}"


def _unpickler_detail(message: str) -> str:
    """The informative line of torch's weights-only unpickler error (a blocked global, if one is named)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    named_global = [line for line in lines if "global" in line.lower()]
    if named_global:
        return named_global[0]
    boilerplate = ("Weights only load failed", "Please file", "Check the")
    informative = [line for line in lines if not line.startswith(boilerplate)]
    return (informative[0].split("WeightsUnpickler error:")[-1].strip() or informative[-1]) if informative else lines[0]


def is_lkat_checkpoint(obj: dict[str, Any]) -> bool:
    """Whether a loaded dict is in the lkat-lens format (any version)."""
    return isinstance(obj.get("format"), str) and obj["format"].startswith("lkat-lens/")


def extract_state_dict(obj: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of a bare or wrapped state_dict (DDP 'module.' and compile '_orig_mod.' prefixes removed)."""
    for key in _WRAPPER_KEYS:
        if isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise CheckpointError("the file holds no tensors that could be model weights")
    cleaned = {}
    for name, value in tensors.items():
        for prefix in _NAME_PREFIXES:
            name = name.removeprefix(prefix)
        cleaned[name] = value
    return cleaned


def is_reference_trainer_checkpoint(obj: dict[str, Any]) -> bool:
    """Whether a loaded dict is the reference trainer's checkpoint: a `model` state_dict next to its `cfg`."""
    return isinstance(obj.get("model"), dict) and "cfg" in obj


def infer_model_kwargs(state_dict: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Read the options of an LKAT/rbfKAT state_dict off its keys and shapes: image and patch size, classes,
    registers, class token, absolute positions, KAN grid and form, GLA convs and widths, the 2dv0 RoPE tables.

    What leaves no trace in the tensors keeps the variant's default: `rope_theta` of the 2dv1 RoPE (2dv0 stores
    its tables) and, without `pos_embed` or 2dv0 tables, the image size.
    """
    try:
        proj = state_dict["patch_embed.proj.weight"]
        registers = state_dict["register_tokens"].shape[1]
        grid = state_dict["blocks.0.mlp.fc1.rbf.grid"]
    except KeyError as err:
        raise CheckpointError(f"not an LKAT/rbfKAT state_dict: it has no {err.args[0]!r}") from None
    dim, patch = proj.shape[0], proj.shape[-1]
    has_cls = "cls_token" in state_dict
    kwargs: dict[str, Any] = {
        "patch_size": patch,
        "in_chans": proj.shape[1],
        "num_registers": registers,
        "use_cls_token": has_cls,
        "use_abs_pos": "pos_embed" in state_dict,
        "kan_num_grids": grid.numel(),
        "kan_grid_min": float(grid[0]),
        "kan_grid_max": float(grid[-1]),
        "kan_layernorm": "blocks.0.mlp.fc1.layernorm.weight" in state_dict,
        "kan_base_update": "blocks.0.mlp.fc1.base_linear.weight" in state_dict,
        "kan_gated": "blocks.0.mlp.fc1.gat_resid.weight" in state_dict,
        "num_classes": state_dict["head.weight"].shape[0] if "head.weight" in state_dict else 0,
    }
    v0_table = state_dict.get("blocks.0.attn.rotary.freqs_cos")
    if "pos_embed" in state_dict:
        kwargs["img_size"] = math.isqrt(state_dict["pos_embed"].shape[1] - registers - int(has_cls)) * patch
    elif v0_table is not None:
        kwargs["img_size"] = math.isqrt(v0_table.shape[0]) * patch
    if v0_table is not None:
        kwargs["rope_mode"] = "2dv0"
    if "blocks.0.attn.q_proj.weight" in state_dict:  # GLA
        conv = state_dict.get("blocks.0.attn.q_conv1d.weight")
        kwargs["use_short_conv"] = conv is not None
        if conv is not None:
            kwargs["conv_size"] = conv.shape[-1]
        kwargs["expand_k"] = state_dict["blocks.0.attn.q_proj.weight"].shape[0] / dim
        kwargs["expand_v"] = state_dict["blocks.0.attn.v_proj.weight"].shape[0] / dim
    if "blocks.0.mlp.fc1.grid_weight" in state_dict:
        kwargs["kan_basis"] = "channel"
    elif "blocks.0.mlp.fc1.spline_linear.weight" in state_dict:
        kwargs["kan_basis"] = "edge"
    return kwargs


def build_and_load(
    model_name: str, model_kwargs: dict[str, Any], state_dict: dict[str, torch.Tensor], *, strict: bool = True
) -> nn.Module:
    """Build `model_name(**model_kwargs)` and load `state_dict`; any mismatch raises one CheckpointError."""
    from .models import create_model

    kwargs = dict(model_kwargs)
    try:
        model = create_model(model_name, num_classes=kwargs.pop("num_classes", 1000), **kwargs)
    except (ValueError, TypeError, RuntimeError) as err:
        raise CheckpointError(f"cannot build model {model_name!r} with {model_kwargs}: {err}") from None
    problems = _state_dict_problems(model, state_dict, strict)
    if problems:
        raise CheckpointError(f"weights do not fit {model_name}: " + "; ".join(problems))
    try:
        model.load_state_dict(state_dict, strict=strict)
    except ValueError as err:  # e.g. a non-uniform rbf.grid
        raise CheckpointError(f"weights do not fit {model_name}: {err}") from None
    return model.eval()


def _state_dict_problems(model: nn.Module, state_dict: dict[str, torch.Tensor], strict: bool) -> list[str]:
    expected = model.state_dict()
    problems = []
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    if strict and missing:
        problems.append(f"{len(missing)} missing keys (e.g. {', '.join(missing[:3])})")
    if strict and unexpected:
        problems.append(f"{len(unexpected)} unexpected keys (e.g. {', '.join(unexpected[:3])})")
    wrong = [
        f"{k}: file {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
        for k, v in state_dict.items()
        if k in expected and v.shape != expected[k].shape
    ]
    if wrong:
        problems.append(f"{len(wrong)} tensors of the wrong shape ({'; '.join(wrong[:3])})")
    return problems


def load(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    *,
    variant: str | None = None,
    strict: bool = True,
) -> tuple[nn.Module, CheckpointInfo]:
    """Rebuild the model of a checkpoint and return (model in eval mode, its metadata).

    The reference trainer's checkpoint (`model`, `optimizer`, `epoch`, ..., `cfg`) loads as it is: the variant,
    every model option and the dataset's normalisation come from its `cfg` (see `reference_cfg`). A bare or
    wrapped reference-code state_dict loads when `variant` names the registry model it was trained as, e.g.
    ``load("ref.pt", variant="lkat_tiny_patch16_224")``; its options are then read off the tensor shapes.
    """
    obj = read_checkpoint(path)
    if is_lkat_checkpoint(obj):
        info = _lkat_info(obj, path)
        state_dict = obj["state_dict"]
    elif is_reference_trainer_checkpoint(obj):
        from .reference_cfg import reference_info

        state_dict = extract_state_dict(obj)
        info = reference_info(obj, state_dict, str(path))
    elif variant is not None:
        state_dict = extract_state_dict(obj)
        kwargs = infer_model_kwargs(state_dict)
        provenance = {"model_name": "variant argument", **{k: "state_dict shapes" for k in kwargs}}
        info = CheckpointInfo(str(path), variant, kwargs, format="reference", provenance=provenance)
    else:
        raise CheckpointError(
            f"{path} is not an lkat-lens checkpoint (no 'format' key); if it is a reference-code state_dict, "
            "pass the variant it was trained as (variant=... / --variant)"
        )
    model = build_and_load(info.model_name, info.model_kwargs, state_dict, strict=strict)
    with_data_config(model, info.data)
    return model.to(device), info


DATA_CONFIG_KEYS = ("mean", "std", "crop_pct", "interpolation")


def with_data_config(model: nn.Module, data: dict[str, Any]) -> None:
    """Set timm's pretrained_cfg of a loaded model to the eval transform its checkpoint records (normalisation,
    crop, interpolation, input size), so that timm.data.resolve_data_config(model=m) reproduces it."""
    cfg = dict(getattr(model, "pretrained_cfg", None) or {})
    cfg |= {key: tuple(data[key]) if key in ("mean", "std") else data[key] for key in DATA_CONFIG_KEYS if key in data}
    if "img_size" in data:
        cfg["input_size"] = (3, int(data["img_size"]), int(data["img_size"]))
    model.pretrained_cfg = model.default_cfg = cfg


def _lkat_info(obj: dict[str, Any], path: str | os.PathLike) -> CheckpointInfo:
    if obj["format"] != FORMAT:
        raise CheckpointError(f"{path} has format {obj['format']!r}; this lkat-lens reads {FORMAT!r}")
    missing = [k for k in _REQUIRED if k not in obj]
    spec = obj.get("model")
    if missing or not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise CheckpointError(f"{path} is an incomplete lkat-lens checkpoint (missing {missing or ['model.name']})")
    if not isinstance(obj["state_dict"], dict):
        raise CheckpointError(f"{path} has no state_dict dict")
    return CheckpointInfo(
        path=str(path),
        model_name=spec["name"],
        model_kwargs=dict(spec.get("kwargs", {})),
        data=dict(obj.get("data", {})),
        train=dict(obj.get("train", {})),
        metrics=list(obj.get("metrics", [])),
    )
