"""The trainer's settings as one frozen, typed value, and the one function that merges them."""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from . import data as lkdata
from . import recipe as lkrecipe

DEFAULT_MODEL = {"digits": "lkat_micro"}  # other datasets: FALLBACK_MODEL
FALLBACK_MODEL = "lkat_tiny_patch16_224"
# On --resume every setting comes from the checkpoint except those of this invocation (always from the command
# line) and those of this machine (from the command line when given there).
INVOCATION_FLAGS = (
    "device", "compile", "compile_mode", "activation_memory_budget", "eager_graphs", "threads", "max_steps",
)  # fmt: skip
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's
MACHINE_FLAGS = ("workers", "data_dir", "download", "cache_images")


def replays_cuda_graphs(compile_mode: str) -> bool:
    """Whether torch.compile's `compile_mode` replays the step as CUDA graphs (its options set triton.cudagraphs)."""
    from torch._inductor import list_mode_options  # here: importing the config stays light

    return bool(list_mode_options(compile_mode).get("triton.cudagraphs", False))


class UsageError(ValueError):
    """A bad flag value or combination (a user error)."""


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run. A field's default is the flag's default before merging: None means
    "the recipe's, model's or dataset's", filled in by `resolve_config`."""

    # data
    data: str = "digits"
    data_dir: str = "data"
    download: bool = False
    workers: int | None = None
    train_images: int | None = None  # procedural datasets (shapes): images per split (None: the dataset's)
    val_images: int | None = None
    cache_images: bool = False  # shapes: draw every image once into memory before training
    # model
    model: str | None = None
    img_size: int | None = None
    patch_size: int | None = None
    kan_num_grids: int | None = None
    kan_basis: str | None = None
    kan_gated: bool | None = None
    drop_path: float | None = None
    drop: float = 0.0
    attn_drop: float = 0.0
    # recipe
    recipe: str | None = None
    finetune: str | None = None
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    weight_decay: float | None = None
    warmup_epochs: int | None = None
    clip_grad: float | None = None
    ema: bool = False
    ema_decay: float = 0.9998
    # run
    seed: int = 0
    device: str = "auto"
    amp: str = "auto"
    compile: bool = False
    compile_mode: str = "default"
    activation_memory_budget: float | None = None
    eager_graphs: bool = False
    threads: int | None = None
    resume: str | None = None
    name: str | None = None
    out_dir: str = "runs"
    max_steps: int | None = None
    # telemetry and snapshots
    telemetry: bool = True
    telemetry_every: int | None = None
    telemetry_images: int = 16
    snapshot_every: int | None = None
    keep: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain values (what checkpoints store under train.args)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """A config from a mapping; unknown keys are dropped and missing ones (older checkpoints) get defaults."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


def resolve_config(
    args: argparse.Namespace, finetune: dict[str, Any] | None = None, saved: dict[str, Any] | None = None
) -> TrainConfig:
    """The run's settings, merged in one place.

    A fresh run: each flag given on the command line, else the recipe's value (epochs, batch, lr, weight decay,
    warmup, drop path), else the --finetune checkpoint's (model, image size), else the dataset's (model, image
    size, workers). A --resume run (`saved` = the checkpoint's train.args): the saved settings, except
    INVOCATION_FLAGS (always this command line's) and MACHINE_FLAGS (this command line's when given there).
    """
    given = {k: v for k, v in vars(args).items() if k in {f.name for f in fields(TrainConfig)}}
    if saved is not None:
        defaults = TrainConfig()
        merged = dict(saved)
        merged.update({k: given[k] for k in INVOCATION_FLAGS})
        merged.update({k: given[k] for k in MACHINE_FLAGS if given[k] != getattr(defaults, k)})
        check_compile_flags(merged)
        return TrainConfig.from_dict(merged)
    cfg = {**TrainConfig().to_dict(), **given}
    dataset = cfg["data"]
    recipe = lkrecipe.get_recipe(cfg["recipe"] or lkrecipe.default_recipe(dataset, finetune is not None))
    cfg["recipe"] = recipe.name
    if finetune is not None:
        ft_model = finetune["model"]["name"]
        if cfg["model"] not in (None, ft_model):
            raise UsageError(f"--model {cfg['model']} differs from the --finetune checkpoint's model {ft_model}")
        cfg["model"] = ft_model
        if cfg["img_size"] is None:
            cfg["img_size"] = int(finetune["model"]["kwargs"].get("img_size", 224))
    defaults = {
        "model": DEFAULT_MODEL.get(dataset, FALLBACK_MODEL),
        "img_size": lkdata.DEFAULT_IMG_SIZE[dataset],
        "epochs": lkrecipe.epochs_for(recipe, dataset),
        "batch_size": recipe.batch_size,
        "lr": recipe.lr,
        "weight_decay": recipe.weight_decay,
        "warmup_epochs": recipe.warmup_epochs,
        "drop_path": recipe.drop_path,
        "workers": 0 if dataset == "digits" else min(8, os.cpu_count() or 1),
    }
    for key, value in defaults.items():
        if cfg[key] is None:
            cfg[key] = value
    cfg["name"] = cfg["name"] or f"{cfg['model']}-{dataset}-{datetime.now():%Y%m%d-%H%M%S}"
    if dataset not in lkdata.DATASET_OPTIONS:
        for key in ("train_images", "val_images"):
            if cfg[key] is not None:
                raise UsageError(f"--{key.replace('_', '-')} applies to procedural datasets (shapes), not {dataset}")
        if cfg["cache_images"]:
            raise UsageError(f"--cache-images applies to procedural datasets (shapes), not {dataset}")
    minimum = {"epochs": 1, "batch_size": 1, "img_size": 1, "warmup_epochs": 0, "workers": 0}
    minimum.update(train_images=1, val_images=1)
    minimum.update(telemetry_every=1, telemetry_images=1, snapshot_every=1, keep=1)
    for key, low in minimum.items():
        if cfg[key] is not None and cfg[key] < low:
            raise UsageError(f"--{key.replace('_', '-')} is out of range: {cfg[key]}")
    check_compile_flags(cfg)
    if cfg["keep"] is not None and cfg["snapshot_every"] is None:
        raise UsageError("--keep K needs --snapshot-every N (it keeps the newest K epoch snapshots)")
    for key in ("drop", "attn_drop"):
        if not 0.0 <= cfg[key] < 1.0:
            raise UsageError(f"--{key.replace('_', '-')} must lie in [0, 1): {cfg[key]}")
    return TrainConfig.from_dict(cfg)


def check_compile_flags(cfg: dict[str, Any]) -> None:
    """Reject --compile-mode and --activation-memory-budget without --compile, a budget outside (0, 1], and
    --eager-graphs with --compile (torch.compile launches the kernels itself)."""
    if cfg.get("compile_mode", "default") != "default" and not cfg["compile"]:
        raise UsageError(f"--compile-mode {cfg['compile_mode']} needs --compile")
    budget = cfg.get("activation_memory_budget")
    if budget is not None and not cfg["compile"]:
        raise UsageError(f"--activation-memory-budget {budget} needs --compile")
    if budget is not None and not 0.0 < budget <= 1.0:
        raise UsageError(f"--activation-memory-budget must lie in (0, 1]: {budget}")
    if cfg.get("eager_graphs") and cfg["compile"]:
        raise UsageError(
            "--eager-graphs replays the eager steps' kernels as CUDA graphs; it does not go with --compile"
        )
