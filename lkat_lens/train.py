"""`lkat-lens train` (= `python -m lkat_lens.train`): train an LKAT (or a baseline) -> runs/<name>/{last,best}.pt,
metrics.jsonl and telemetry.jsonl (per-block internals on a fixed probe batch, docs/telemetry.md).

With no arguments it trains lkat_micro on scikit-learn's handwritten digits, on the CPU, in a few minutes.
Under torchrun (DDP) --batch-size is the global batch: each of the N ranks takes batch/N samples of it (the
sampler deals the shuffled indices round-robin, so a step sees the same samples as a single-process step),
gradients are averaged over ranks, and rank 0 alone logs and writes files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.layers import resample_abs_pos_embed
from timm.scheduler.scheduler import Scheduler
from timm.utils import ModelEmaV3
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset
from tqdm import tqdm

from . import data as lkdata
from . import distributed as lkdist
from . import recipe as lkrecipe
from .checkpoint import (
    CheckpointError,
    extract_state_dict,
    infer_model_kwargs,
    is_lkat_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from .flat_params import FlatParameters
from .models import VARIANTS, create_model
from .seeding import epoch_seed, rng_state, seed_all, set_rng_state
from .telemetry import Telemetry, probe_batch
from .train_config import COMPILE_MODES, FALLBACK_MODEL, TrainConfig, UsageError, replays_cuda_graphs, resolve_config


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, permissions); files already written are intact."""


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or infinite."""


class LaggedLoss:
    """Each step's training loss (mean over ranks), read on the host one step late: queued to pinned memory behind
    the step's forward and read once the next step's forward is queued, so the host never waits for the GPU in
    mid-step. Reading it at once cost a CUDA-graphed step at 224² 9 % (LKAT-S) and 11 % (ViT-S) of its time on an
    H100, the GPU idle while the host launched the rest of the step. A non-finite loss raises NonFiniteLoss when it
    is read (after the next step's forward, or at the end of the epoch): before anything is saved, the model in memory
    having taken that one step's update. `total` and `steps` sum the losses read so far."""

    def __init__(self, device: torch.device, world_size: int) -> None:
        self._host = torch.empty((), dtype=torch.float32, pin_memory=device.type == "cuda")
        self._world_size = world_size
        self._pending: tuple[torch.cuda.Event | None, int, int] | None = None  # (copied, epoch, step), 1-based
        self.total, self.steps = 0.0, 0

    def push(self, loss: torch.Tensor, epoch: int, step: int) -> float | None:
        """Queue the loss of (1-based) `epoch`, `step`; return the previous step's, or None at the first."""
        previous = self.pop()
        self._host.copy_(lkdist.all_reduce_sum(loss.detach().float()), non_blocking=True)
        copied = torch.cuda.Event() if loss.is_cuda else None
        if copied is not None:
            copied.record(torch.cuda.current_stream(loss.device))  # the copy's stream, whichever device is current
        self._pending = (copied, epoch, step)
        return previous

    def pop(self) -> float | None:
        """The queued loss (None if none is), waiting for its copy; raises NonFiniteLoss if it is not finite."""
        if self._pending is None:
            return None
        copied, epoch, step = self._pending
        self._pending = None
        if copied is not None:
            copied.synchronize()
        value = float(self._host) / self._world_size
        if not math.isfinite(value):
            raise NonFiniteLoss(f"non-finite training loss ({value}) at epoch {epoch}, step {step}")
        self.total, self.steps = self.total + value, self.steps + 1
        return value


SMALL_CPU_DATASETS = ("digits", "shapes")  # trained on the CPU with tiny models: one torch thread by default
USER_ERRORS = (UsageError, lkdata.DataError, lkrecipe.RecipeError, CheckpointError)


def build_parser(prog: str = "python -m lkat_lens.train") -> argparse.ArgumentParser:
    """The command-line interface of the trainer."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Train an LKAT (or rbfKAT / timm baseline) with the paper's recipes. With no arguments: "
        "lkat_micro on scikit-learn's digits, on the CPU, in a few minutes.",
    )
    g = p.add_argument_group("data")
    g.add_argument(
        "--data",
        default="digits",
        choices=lkdata.DATASETS,
        help="dataset (default: digits; shapes is drawn on the fly)",
    )
    g.add_argument(
        "--data-dir",
        default="data",
        help="root of cifar10/cifar100 (torchvision layout) or of "
        "imagefolder's train/ and val/ folders (default: data)",
    )
    g.add_argument("--download", action="store_true", help="download CIFAR into --data-dir if missing")
    g.add_argument(
        "--workers",
        type=int,
        default=None,
        help="data-loading processes per rank (default: 0 for digits, else min(8, CPUs))",
    )
    g.add_argument(
        "--train-images",
        type=int,
        default=None,
        help="shapes only: training images drawn (default: 10000; every index is a fixed image)",
    )
    g.add_argument("--val-images", type=int, default=None, help="shapes only: validation images (default: 2000)")
    g.add_argument(
        "--cache-images",
        action="store_true",
        help="shapes only: draw every image once, over --workers processes, and keep it in memory (uint8, "
        "150 KB per 224² image), so that each epoch costs the augmentation only",
    )
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        default=None,
        help=f"registry name: {', '.join(VARIANTS)}, vit5_*, or a timm vit_*/mixer_* model "
        f"(default: lkat_micro on digits, else {FALLBACK_MODEL})",
    )
    g.add_argument("--img-size", type=int, default=None, help="input resolution (default: 16 for digits, else 224)")
    g.add_argument("--patch-size", type=int, default=None, help="patch size (default: the model's)")
    g.add_argument("--kan-num-grids", type=int, default=None, help="RBF centers G per KAN layer (default: 4)")
    g.add_argument("--kan-basis", choices=("shared", "channel", "edge"), default=None, help="KAN edge functions")
    g.add_argument("--kan-gated", action="store_true", default=None, help="gated residual in the KAN layers")
    g.add_argument("--drop-path", type=float, default=None, help="stochastic depth rate (default: the recipe's)")
    g.add_argument("--drop", type=float, default=0.0, help="dropout rate after the embedding and in the MLPs")
    g.add_argument("--attn-drop", type=float, default=0.0, help="dropout rate on softmax attention weights")
    g = p.add_argument_group("recipe")
    g.add_argument(
        "--recipe",
        default=None,
        choices=tuple(lkrecipe.RECIPES),
        help="preset (default: digits on digits, deit elsewhere, finetune-b with --finetune)",
    )
    g.add_argument(
        "--finetune",
        default=None,
        metavar="CKPT",
        help="start from this checkpoint's weights with a new head (model name and architecture come from it)",
    )
    g.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="default: the recipe's (deit: 100 CIFAR-10, 200 CIFAR-100, 300 imagefolder)",
    )
    g.add_argument("--batch-size", type=int, default=None, help="global batch, split over DDP ranks")
    g.add_argument("--lr", type=float, default=None, help="peak learning rate")
    g.add_argument("--weight-decay", type=float, default=None)
    g.add_argument("--warmup-epochs", type=int, default=None)
    g.add_argument("--clip-grad", type=float, default=None, help="clip the gradient norm to this value")
    g.add_argument("--ema", action="store_true", help="keep (and evaluate) an EMA of the weights")
    g.add_argument("--ema-decay", type=float, default=0.9998)
    g = p.add_argument_group("run")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    g.add_argument(
        "--amp",
        choices=("auto", "bf16", "fp16", "off"),
        default="auto",
        help="autocast dtype (auto: bf16 on CUDA, off on CPU; off on CUDA also turns TF32 off: full fp32)",
    )
    g.add_argument("--compile", action="store_true", help="torch.compile the model")
    g.add_argument(
        "--compile-mode",
        choices=COMPILE_MODES,
        default="default",
        help="torch.compile mode with --compile; reduce-overhead replays each step as CUDA graphs (one process on "
        "CUDA; the fastest LKAT training measured, README)",
    )
    g.add_argument(
        "--activation-memory-budget",
        type=float,
        default=None,
        metavar="B",
        help="with --compile: the share (0, 1] of the activations inductor may save for the backward, the rest "
        "recomputed (torch._functorch.config.activation_memory_budget; default: inductor's own choice). LKAT-T at "
        "224^2 under CUDA graphs, H100: 0.5 took 14.6 MiB per image against 25.4, for 14 %% fewer images/s (README)",
    )
    g.add_argument(
        "--eager-graphs",
        action="store_true",
        help="on CUDA without --compile: each LKAT layer's GLA core and KAN MLP replay as CUDA graphs "
        "(set_backends(eager_graphs=True)): LKAT-T's eager training steps 1.55-1.6x faster on an H200, for 1.6x "
        "the memory (LKAT-S and -B: 1.1x and 0.94x as fast, 1.3x the memory; README)",
    )
    g.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads per process (default: 1 for digits and shapes on the CPU, where tiny models "
        "gain little from more and a shared CPU makes extra threads thrash; else torch's choice)",
    )
    g.add_argument(
        "--resume",
        default=None,
        metavar="CKPT",
        help="continue runs/<name>/last.pt exactly; settings come from it, except --device, --compile, "
        "--threads, --max-steps and (when given) --workers, --data-dir, --download",
    )
    g.add_argument("--name", default=None, help="run name (default: <model>-<data>-<date>-<time>)")
    g.add_argument("--out-dir", default="runs", help="runs are written to <out-dir>/<name>/ (default: runs)")
    g.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="stop after this many optimizer steps in total (smoke tests, benchmarks); the epoch it stops "
        "in counts as done",
    )
    g = p.add_argument_group("telemetry and snapshots (docs/telemetry.md)")
    g.add_argument(
        "--no-telemetry",
        dest="telemetry",
        action="store_false",
        help="do not write telemetry.jsonl (per-block gates, KAN coverage, token norms at the end of each epoch)",
    )
    g.add_argument("--telemetry-every", type=int, default=None, metavar="N", help="also record every N steps")
    g.add_argument("--telemetry-images", type=int, default=16, help="validation images in the probe batch")
    g.add_argument("--snapshot-every", type=int, default=None, metavar="N", help="keep epoch_NNN.pt every N epochs")
    g.add_argument("--keep", type=int, default=None, metavar="K", help="keep only the newest K epoch snapshots")
    return p


@dataclass
class Run:
    """Everything a training run holds between epochs."""

    cfg: TrainConfig
    dist: lkdist.DistInfo
    recipe: lkrecipe.Recipe
    run_dir: Path
    model: nn.Module  # the bare module: state dicts, EMA, evaluation
    forward: nn.Module  # what a training step calls (DDP and/or compiled wrapper of `model`)
    model_kwargs: dict[str, Any]
    data_info: dict[str, Any]
    train_loader: DataLoader
    val_loader: DataLoader
    loader_gen: torch.Generator
    optimizer: torch.optim.Optimizer
    scheduler: Scheduler
    scaler: torch.amp.GradScaler
    criterion: nn.Module
    mixup: Mixup | None
    ema: ModelEmaV3 | None
    amp_dtype: torch.dtype | None
    epoch: int = 0  # completed epochs
    step: int = 0  # optimizer steps taken
    metrics: list[dict[str, Any]] = field(default_factory=list)
    telemetry: Telemetry | None = None  # rank 0 of a run with telemetry on
    flat: FlatParameters | None = None  # compiled without CUDA graphs: `model`'s parameters as views of a few flats

    def trained_parameters(self) -> list[nn.Parameter]:
        """The tensors the optimizer updates (the flats of a run that has them, else the model's parameters)."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state_dict per model parameter, as checkpoints hold it (unflattened)."""
        state = self.optimizer.state_dict()
        return state if self.flat is None else self.flat.unflatten_optimizer_state(state)

    def record_telemetry(self, kind: str) -> None:
        """A telemetry record of the model as it stands, every parameter's .grad its last gradient (a run's flats
        lend theirs for the record)."""
        with nullcontext() if self.flat is None else self.flat.gradients_exposed():
            self.telemetry.record(self.model, kind=kind, epoch=self.epoch, step=self.step)

    @property
    def best_top1(self) -> float:
        """Best validation top-1 so far (-1 before the first evaluation)."""
        return max((m["val_top1"] for m in self.metrics), default=-1.0)

    def autocast(self) -> AbstractContextManager:
        """The autocast context of the run's --amp setting."""
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.dist.device.type, dtype=self.amp_dtype)


def amp_dtype_for(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of an --amp value on `device` (None: no autocast)."""
    if amp == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    if amp == "fp16" and device.type != "cuda":
        raise UsageError("--amp fp16 needs a CUDA device; use bf16 or off on the CPU")
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}[amp]


def build_datasets(
    cfg: TrainConfig, recipe: lkrecipe.Recipe, info: lkdist.DistInfo
) -> tuple[Dataset, Dataset, dict[str, Any]]:
    """Train and val datasets with the recipe's transforms, and the checkpoint's `data` dict."""
    name, size = cfg.data, cfg.img_size
    mean, std = lkdata.NORMALIZATION[name]
    train_tf = lkrecipe.build_train_transform(recipe, size, mean, std)
    val_tf = lkrecipe.build_eval_transform(recipe, size, mean, std)

    options = dataset_options(cfg)

    def both(download: bool) -> tuple[Dataset, Dataset]:
        kw = dict(data_dir=cfg.data_dir, download=download, img_size=size, options=options)
        return (
            lkdata.build_dataset(name, "train", transform=train_tf, **kw),
            lkdata.build_dataset(name, "val", transform=val_tf, **kw),
        )

    if cfg.download and info.distributed:  # rank 0 downloads, the others read what it wrote
        if info.is_main:
            both(True)
        lkdist.barrier()
    train_ds, val_ds = both(cfg.download and not info.distributed)
    if cfg.cache_images:
        for ds in (train_ds, val_ds):
            ds.draw_all(cfg.workers)
    data_info = {
        "name": name,
        "class_names": lkdata.check_same_classes(train_ds, val_ds),
        "img_size": size,
        "in_chans": lkdata.IN_CHANS,
        "mean": list(mean),
        "std": list(std),
        "crop_pct": recipe.crop_pct,
        "interpolation": recipe.interpolation,
    }
    if options is not None:  # with the sizes in effect, so a later reader rebuilds the same images
        data_info["options"] = options | {"train_images": len(train_ds), "val_images": len(val_ds)}
    return train_ds, val_ds, data_info


def dataset_options(cfg: TrainConfig) -> dict[str, Any] | None:
    """A procedural dataset's settings (what rebuilds the same images later); None for datasets on disk."""
    if cfg.data not in lkdata.DATASET_OPTIONS:
        return None
    sizes = {"train_images": cfg.train_images, "val_images": cfg.val_images}
    return {k: v for k, v in sizes.items() if v is not None} | {"seed": 0}


def build_loaders(
    cfg: TrainConfig, info: lkdist.DistInfo, train_ds: Dataset, val_ds: Dataset, mixes: bool
) -> tuple[DataLoader, DataLoader, torch.Generator]:
    """Loaders of this rank's share: shuffled by (seed, epoch), full batches, generator reseeded per epoch."""
    if cfg.batch_size % info.world_size:
        raise UsageError(f"--batch-size {cfg.batch_size} does not split evenly over {info.world_size} ranks")
    per_rank = cfg.batch_size // info.world_size
    if mixes and per_rank % 2:
        raise UsageError(f"Mixup/CutMix in batch mode needs an even batch per rank, got {per_rank}")
    if len(train_ds) < cfg.batch_size:
        raise UsageError(f"--batch-size {cfg.batch_size} exceeds the {len(train_ds)} training images")
    common = dict(num_workers=cfg.workers, pin_memory=info.device.type == "cuda")
    sampler = DistributedSampler(
        train_ds, num_replicas=info.world_size, rank=info.rank, shuffle=True, seed=cfg.seed, drop_last=True
    )
    gen = torch.Generator()
    train_loader = DataLoader(train_ds, batch_size=per_rank, sampler=sampler, drop_last=True, generator=gen, **common)
    val_shard = Subset(val_ds, range(info.rank, len(val_ds), info.world_size))
    val_loader = DataLoader(val_shard, batch_size=per_rank, generator=torch.Generator().manual_seed(0), **common)
    return train_loader, val_loader, gen


def model_kwargs_for(
    cfg: TrainConfig, recipe: lkrecipe.Recipe, num_classes: int, base: dict[str, Any]
) -> dict[str, Any]:
    """Constructor kwargs of the run's model: `base` (a fine-tuned checkpoint's), then flags and recipe."""
    kwargs = {**base, "num_classes": num_classes, "img_size": cfg.img_size, "in_chans": lkdata.IN_CHANS}
    for flag in ("patch_size", "kan_num_grids", "kan_basis", "kan_gated"):
        if getattr(cfg, flag) is not None:
            kwargs[flag] = getattr(cfg, flag)
    if cfg.drop_path is not None:
        kwargs["drop_path_rate"] = cfg.drop_path
    if cfg.drop:  # passed only when set, so checkpoints of runs without dropout keep their kwargs
        kwargs["drop_rate"] = cfg.drop
    if cfg.attn_drop:
        kwargs["attn_drop_rate"] = cfg.attn_drop
    if cfg.model in VARIANTS:
        kwargs.update(recipe.model_kwargs)
    return kwargs


def build_model(name: str, kwargs: dict[str, Any]) -> nn.Module:
    """create_model(name, **kwargs), with construction errors reported as user errors."""
    kw = dict(kwargs)
    try:
        return create_model(name, num_classes=kw.pop("num_classes"), **kw)
    except (ValueError, TypeError, RuntimeError) as err:
        raise UsageError(f"cannot build model {name!r} with {kwargs}: {err}") from None


def load_pretrained(model: nn.Module, ckpt: dict[str, Any], path: str) -> str:
    """Load a checkpoint's weights except its head (resizing pos_embed to the new grid); a summary line."""
    state = {k: v for k, v in ckpt["state_dict"].items() if not k.startswith("head.")}
    target = model.state_dict()
    if "pos_embed" in state and "pos_embed" in target and state["pos_embed"].shape != target["pos_embed"].shape:
        state["pos_embed"] = fit_pos_embed(state["pos_embed"], model)
    wrong = [
        f"{k} {tuple(v.shape)} vs {tuple(target[k].shape)}"
        for k, v in state.items()
        if k in target and v.shape != target[k].shape
    ]
    if wrong:
        raise UsageError(f"--finetune {path}: weights do not fit the new model: {'; '.join(wrong[:3])}")
    missing, unexpected = model.load_state_dict(state, strict=False)
    new = [k for k in missing if not k.startswith("head.")]
    return (
        f"fine-tuning from {path}: {len(state) - len(unexpected)} tensors loaded, new head"
        + (f", newly initialised: {', '.join(new)}" if new else "")
        + (f", unused: {', '.join(unexpected)}" if unexpected else "")
    )


def fit_pos_embed(pos_embed: torch.Tensor, model: nn.Module) -> torch.Tensor:
    """Resample the patch part of a position embedding to `model`'s patch grid; other tokens stay."""
    patches = model.token_layout["patches"]
    extra = model.pos_embed.shape[1] - (patches.stop - patches.start)  # 0 when only patches are embedded
    prefix = patches.start if extra else 0
    end = pos_embed.shape[1] - (extra - prefix)
    grid = list(model.patch_embed.grid_size)
    resized = resample_abs_pos_embed(pos_embed[:, prefix:end], grid, num_prefix_tokens=0)
    return torch.cat([pos_embed[:, :prefix], resized, pos_embed[:, end:]], dim=1)


def train_one_epoch(run: Run) -> dict[str, float]:
    """One pass over this rank's shard; returns train_loss (mean over ranks and steps), lr, images/s, time."""
    cfg, info = run.cfg, run.dist
    run.model.train()
    run.train_loader.sampler.set_epoch(run.epoch)
    run.loader_gen.manual_seed(epoch_seed(cfg.seed, run.epoch, info.rank))
    images_seen = 0
    losses = LaggedLoss(info.device, info.world_size)
    start = time.perf_counter()
    bar = tqdm(
        run.train_loader,
        desc=f"epoch {run.epoch + 1}/{cfg.epochs}",
        leave=False,
        disable=not info.is_main,
        dynamic_ncols=True,
        mininterval=0.5,
    )
    for images, targets in bar:
        images = images.to(info.device, non_blocking=True)
        targets = targets.to(info.device, non_blocking=True)
        if run.mixup is not None:
            images, targets = run.mixup(images, targets)
        if cfg.compile and cfg.compile_mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # this step's graphs may overwrite the last step's outputs
        with run.autocast():
            loss = run.criterion(run.forward(images), targets)
        value = losses.push(loss, run.epoch + 1, run.step + 1)
        run.optimizer.zero_grad(set_to_none=True)
        run.scaler.scale(loss).backward()
        if cfg.clip_grad is not None:
            run.scaler.unscale_(run.optimizer)
            nn.utils.clip_grad_norm_(run.trained_parameters(), cfg.clip_grad)
        run.scaler.step(run.optimizer)
        run.scaler.update()
        run.step += 1
        run.scheduler.step_update(run.step)
        if run.ema is not None:
            run.ema.update(run.model, step=run.step)
        if run.telemetry is not None and cfg.telemetry_every and run.step % cfg.telemetry_every == 0:
            run.record_telemetry("step")
        images_seen += images.shape[0]
        if value is not None:
            bar.set_postfix(loss=f"{value:.4f}", refresh=False)
        if cfg.max_steps is not None and run.step >= cfg.max_steps:
            break
    bar.close()
    losses.pop()
    if info.device.type == "cuda":
        torch.cuda.synchronize(info.device)
    elapsed = time.perf_counter() - start
    return {
        "train_loss": losses.total / max(losses.steps, 1),
        "lr": run.optimizer.param_groups[0]["lr"],
        "images_per_s": images_seen * info.world_size / elapsed,
        "steps": losses.steps,
    }


@torch.no_grad()
def evaluate(model: nn.Module, run: Run) -> dict[str, float]:
    """Validation cross-entropy, top-1 and top-5 (%) over all ranks' shards."""
    model.eval()
    device = run.dist.device
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top-1 hits, top-5 hits, count
    k = min(5, len(run.data_info["class_names"]))
    for images, targets in tqdm(
        run.val_loader,
        desc="eval",
        leave=False,
        disable=not run.dist.is_main,
        dynamic_ncols=True,
        mininterval=0.5,
    ):
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with run.autocast():
            logits = model(images).float()
        hits = logits.topk(k, dim=1).indices.eq(targets[:, None])
        sums += torch.stack(
            [
                F.cross_entropy(logits, targets, reduction="sum").double(),
                hits[:, 0].sum().double(),
                hits.any(dim=1).sum().double(),
                torch.tensor(float(len(targets)), dtype=torch.float64, device=device),
            ]
        )
    loss, top1, top5, count = lkdist.all_reduce_sum(sums).tolist()
    return {"val_loss": loss / count, "val_top1": 100.0 * top1 / count, "val_top5": 100.0 * top5 / count}


def save_run(run: Run, path: Path, rngs: list[dict[str, Any]] | None) -> None:
    """Write the run's checkpoint; with `rngs` (every rank's RNG state) it also holds what --resume needs."""
    resume_state: dict[str, Any] = {}
    if rngs is not None:
        resume_state = dict(
            optimizer=run.optimizer_state(),
            scheduler=run.scheduler.state_dict(),
            scaler=run.scaler.state_dict() if run.scaler.is_enabled() else None,
            rng={"ranks": rngs},
        )
    try:
        _write_checkpoint(run, path, resume_state)
    except OSError as err:
        raise CheckpointWriteError(
            f"could not write {path}: {err}; the checkpoints written before are intact (resume from last.pt)"
        ) from None


def _write_checkpoint(run: Run, path: Path, resume_state: dict[str, Any]) -> None:
    save_checkpoint(
        path,
        model_name=run.cfg.model,
        model_kwargs=run.model_kwargs,
        state_dict=run.model.state_dict(),
        data=run.data_info,
        train={
            "args": run.cfg.to_dict(),
            "epoch": run.epoch,
            "step": run.step,
            "seed": run.cfg.seed,
            "world_size": run.dist.world_size,
        },
        metrics=run.metrics,
        ema_state_dict=run.ema.module.state_dict() if run.ema is not None else None,
        **resume_state,
    )


def restore_run(run: Run, ckpt: dict[str, Any]) -> None:
    """Put a --resume checkpoint's weights, optimizer, schedule, scaler, EMA, RNGs and counters into `run`."""
    run.model.load_state_dict(ckpt["state_dict"])
    optimizer = ckpt["optimizer"] if run.flat is None else run.flat.flatten_optimizer_state(ckpt["optimizer"])
    run.optimizer.load_state_dict(optimizer)
    run.scheduler.load_state_dict(ckpt["scheduler"])
    if ckpt.get("scaler") is not None:
        run.scaler.load_state_dict(ckpt["scaler"])
    if run.ema is not None and "ema_state_dict" in ckpt:
        run.ema.module.load_state_dict(ckpt["ema_state_dict"])
    run.epoch, run.step = int(ckpt["train"]["epoch"]), int(ckpt["train"]["step"])
    run.metrics = list(ckpt["metrics"])
    rngs = ckpt["rng"]["ranks"]
    if len(rngs) == run.dist.world_size:
        set_rng_state(rngs[run.dist.rank], run.dist.device)
    else:
        seed_all(run.cfg.seed + run.dist.rank + 1_000 * run.epoch)
        log(
            run.dist,
            f"note: resumed on {run.dist.world_size} ranks from a {len(rngs)}-rank run; "
            "random streams are reseeded, so the continuation is not bit-identical",
        )


def prune_snapshots(run_dir: Path, keep: int | None) -> None:
    """Delete all but the newest `keep` epoch_NNN.pt snapshots (None: keep all)."""
    snapshots = sorted(run_dir.glob("epoch_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    for old in snapshots[: -keep if keep else 0]:
        old.unlink(missing_ok=True)


def write_metrics(path: Path, metrics: list[dict[str, Any]]) -> None:
    """Rewrite metrics.jsonl (one JSON object per epoch) atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(m) + "\n" for m in metrics))
    os.replace(tmp, path)


def log(info: lkdist.DistInfo, message: str) -> None:
    """Print on rank 0 only."""
    if info.is_main:
        print(message, flush=True)


def summary_line(m: dict[str, Any], epochs: int) -> str:
    """One line per epoch: losses, accuracy, lr, throughput, time."""
    line = (
        f"epoch {m['epoch']}/{epochs} | train_loss {m['train_loss']:.4f} | val_loss {m['val_loss']:.4f} | "
        f"top1 {m['val_top1']:.2f}% | top5 {m['val_top5']:.2f}% | lr {m['lr']:.2e} | "
        f"{m['images_per_s']:.0f} img/s | {m['time_s']:.1f}s"
    )
    if "ema_val_top1" in m:
        line += f" | ema top1 {m['ema_val_top1']:.2f}%"
    if "max_mem_gb" in m:
        line += f" | {m['max_mem_gb']:.2f} GB"
    return line


def read_resume_source(path: str) -> dict[str, Any]:
    """A trainer's last.pt with everything --resume needs."""
    ckpt = read_checkpoint(path)
    if not is_lkat_checkpoint(ckpt) or not {"optimizer", "scheduler", "rng", "train"} <= ckpt.keys():
        raise CheckpointError(f"{path} holds no training state to resume (resume from a run's last.pt)")
    return ckpt


def read_finetune_source(path: str, model_name: str | None) -> dict[str, Any]:
    """The weights and model spec --finetune starts from: an lkat-lens checkpoint or a reference state_dict."""
    obj = read_checkpoint(path)
    if is_lkat_checkpoint(obj):
        return obj
    if model_name not in VARIANTS:
        raise CheckpointError(
            f"{path} is not an lkat-lens checkpoint; if it is a reference-code state_dict, name the variant it "
            f"was trained as with --model (one of {', '.join(VARIANTS)})"
        )
    state_dict = extract_state_dict(obj)
    return {"model": {"name": model_name, "kwargs": infer_model_kwargs(state_dict)}, "state_dict": state_dict}


def read_sources(args: argparse.Namespace) -> tuple[TrainConfig, Path, dict | None, dict | None]:
    """The merged config, the run folder and the --resume / --finetune checkpoints (None when not asked)."""
    if args.resume:
        resume = read_resume_source(args.resume)
        return resolve_config(args, saved=resume["train"]["args"]), Path(args.resume).parent, resume, None
    finetune = read_finetune_source(args.finetune, args.model) if args.finetune else None
    cfg = resolve_config(args, finetune)
    run_dir = Path(cfg.out_dir) / cfg.name
    if (run_dir / "last.pt").exists():
        raise UsageError(
            f"{run_dir} already holds a run; continue it with --resume {run_dir / 'last.pt'} or pick another --name"
        )
    return cfg, run_dir, None, finetune


def apply_process_settings(cfg: TrainConfig, info: lkdist.DistInfo) -> torch.dtype | None:
    """Threads, seeds, TF32, the backward's thread and torch.compile's activation memory budget for this process;
    returns the autocast dtype."""
    threads = cfg.threads or (1 if cfg.data in SMALL_CPU_DATASETS and info.device.type == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    seed_all(cfg.seed + info.rank)
    amp_dtype = amp_dtype_for(cfg.amp, info.device)
    if info.device.type == "cuda":  # TF32 matmuls alongside autocast; --amp off is full fp32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = amp_dtype is not None
        # backward on the training thread, not the autograd engine's device thread (thread-local: this process's
        # main thread). Eager steps on an H200 (benchmarks/bench_eager_host.py --compare threads, two calls): ViT-T
        # 20-27 % faster, LKAT-S and the B models up to 11 % faster or the same, LKAT-T 17 % faster in one call and
        # 9 % slower in the other, within the lent host's noise; compiled steps replay one graph either way
        torch.autograd.set_multithreading_enabled(False)
    if cfg.activation_memory_budget is not None:  # read when the compiled step is first traced
        torch._functorch.config.activation_memory_budget = cfg.activation_memory_budget
    return amp_dtype


def run_model_kwargs(
    cfg: TrainConfig,
    recipe: lkrecipe.Recipe,
    num_classes: int,
    resume: dict[str, Any] | None,
    finetune: dict[str, Any] | None,
) -> dict[str, Any]:
    """The model's constructor kwargs: a resumed run's own, else built from flags on a fine-tuned model's."""
    if resume is not None:
        return dict(resume["model"]["kwargs"])
    base = {}
    if finetune is not None:
        base = {k: v for k, v in finetune["model"]["kwargs"].items() if k not in ("num_classes", "img_size")}
    return model_kwargs_for(cfg, recipe, num_classes, base)


def wrap_model(
    model: nn.Module, cfg: TrainConfig, info: lkdist.DistInfo, flat: FlatParameters | None = None
) -> nn.Module:
    """What a training step calls: `model` (or `flat`, its flattened form) under DDP when distributed, compiled with
    --compile."""
    forward: nn.Module = model if flat is None else flat
    if info.distributed:
        forward = DistributedDataParallel(
            forward, device_ids=[info.device.index] if info.device.type == "cuda" else None
        )
    if cfg.eager_graphs and hasattr(model, "set_backends"):
        model.set_backends(eager_graphs=True)  # LKAT's core and KAN MLPs as CUDA graphs (kernels/graphed.py)
    if cfg.compile:
        if replays_cuda_graphs(cfg.compile_mode) and hasattr(model, "set_backends"):
            model.set_backends(cuda_graphs=True)  # LKAT's GLA core keeps its short kernels as ops (kernels/gla_core.py)
        forward = torch.compile(forward, mode=cfg.compile_mode)
    return forward


def flattens_parameters(cfg: TrainConfig) -> bool:
    """Whether the run trains through flat Parameters (flat_params.py): compiled without CUDA graphs, where the step
    is bound by the host and the host works per parameter tensor (LKAT-T 1.09x and 1.25x faster in two processes,
    ViT-T 1.13x, on an H200). Eager steps lose by it (the views and the swap cost more host time than they save), and
    so do LKAT-T's under CUDA graphs (0.97x; 0.80x before the flattened module's guards were made tag safe; ViT-T's
    1.02x; benchmarks/bench_flat_params.py --mode reduce-overhead)."""
    return cfg.compile and not replays_cuda_graphs(cfg.compile_mode)


def build_optimisation(
    groups: list[dict[str, Any]], cfg: TrainConfig, recipe: lkrecipe.Recipe, updates_per_epoch: int
) -> tuple[torch.optim.Optimizer, Scheduler]:
    """The recipe's optimizer over parameter `groups` at the run's lr, and its per-update cosine schedule."""
    optimizer = lkrecipe.build_optimizer(groups, recipe, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = lkrecipe.build_scheduler(
        optimizer, recipe, epochs=cfg.epochs, warmup_epochs=cfg.warmup_epochs, updates_per_epoch=updates_per_epoch
    )
    return optimizer, scheduler


def setup_run(args: argparse.Namespace, info: lkdist.DistInfo) -> Run:
    """Resolve the settings, build data, model and optimisation, and restore a --resume checkpoint."""
    cfg, run_dir, resume, finetune = read_sources(args)
    recipe = lkrecipe.get_recipe(cfg.recipe)
    amp_dtype = apply_process_settings(cfg, info)
    train_ds, val_ds, data_info = build_datasets(cfg, recipe, info)
    train_loader, val_loader, gen = build_loaders(cfg, info, train_ds, val_ds, recipe.mixes)
    num_classes = len(data_info["class_names"])
    model_kwargs = run_model_kwargs(cfg, recipe, num_classes, resume, finetune)
    model = build_model(cfg.model, model_kwargs)
    if finetune is not None:
        log(info, load_pretrained(model, finetune, cfg.finetune))
    model.to(info.device)
    groups = lkrecipe.param_groups(model, cfg.weight_decay)
    flat = FlatParameters(model, groups) if flattens_parameters(cfg) else None
    optimizer, scheduler = build_optimisation(
        groups if flat is None else flat.param_groups, cfg, recipe, len(train_loader)
    )
    run = Run(
        cfg=cfg,
        dist=info,
        recipe=recipe,
        run_dir=run_dir,
        model=model,
        forward=wrap_model(model, cfg, info, flat),
        model_kwargs=model_kwargs,
        data_info=data_info,
        train_loader=train_loader,
        val_loader=val_loader,
        loader_gen=gen,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=torch.amp.GradScaler(info.device.type, enabled=amp_dtype is torch.float16),
        criterion=lkrecipe.build_loss(recipe),
        mixup=lkrecipe.build_mixup(recipe, num_classes),
        ema=ModelEmaV3(model, decay=cfg.ema_decay) if cfg.ema else None,
        amp_dtype=amp_dtype,
        flat=flat,
    )
    if resume is not None:
        restore_run(run, resume)
    if cfg.telemetry and info.is_main:
        probe = probe_batch(val_ds, cfg.telemetry_images, cfg.seed)
        run.telemetry = Telemetry(run_dir, probe, lambda m: log(info, m), quiet_epochs=cfg.warmup_epochs)
        run.telemetry.resume(run.epoch, run.step)
    n_params = sum(p.numel() for p in model.parameters())
    log(
        info,
        f"{cfg.model} ({n_params / 1e6:.2f} M params) on {cfg.data}: {len(train_ds)} train / "
        f"{len(val_ds)} val images, {cfg.img_size}px, recipe {recipe.name}, {cfg.epochs} epochs, batch "
        f"{cfg.batch_size} over {info.world_size} rank(s), {info.device}, amp {cfg.amp} -> {run_dir}"
        + (f" (resuming after epoch {run.epoch})" if resume is not None else ""),
    )
    return run


def train(run: Run) -> None:
    """Epoch loop: train, evaluate, log, write last.pt / best.pt / metrics.jsonl (rank 0)."""
    cfg, info = run.cfg, run.dist
    if info.is_main:
        run.run_dir.mkdir(parents=True, exist_ok=True)
    last = run.run_dir / "last.pt"
    while run.epoch < cfg.epochs and (cfg.max_steps is None or run.step < cfg.max_steps):
        start, saved_step = time.perf_counter(), run.step
        if info.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(info.device)
        try:
            stats = train_one_epoch(run)
        except NonFiniteLoss as err:
            kept = (
                f"the last good checkpoint is {last} (epoch {run.epoch})"
                if last.exists()
                else "no checkpoint was written yet"
            )
            raise NonFiniteLoss(f"{err}; stopping, {kept}") from None
        stats.update(evaluate(run.model, run))
        if run.ema is not None:
            stats["ema_val_top1"] = evaluate(run.ema.module, run)["val_top1"]
        run.epoch += 1
        stats.update(epoch=run.epoch, step=run.step, time_s=time.perf_counter() - start)
        if info.device.type == "cuda":
            stats["max_mem_gb"] = torch.cuda.max_memory_allocated(info.device) / 2**30
        is_best = stats["val_top1"] > run.best_top1
        run.metrics.append(stats)
        if run.telemetry is not None:  # before last.pt: a record past the checkpoint is dropped on resume
            run.record_telemetry("epoch")
        rngs = lkdist.gather_objects(rng_state(info.device), info.world_size)
        if info.is_main:
            try:
                save_run(run, last, rngs)
            except CheckpointWriteError:
                if run.telemetry is not None:  # the telemetry file goes back to what last.pt holds
                    run.telemetry.resume(run.epoch - 1, saved_step)
                raise
            if is_best:
                save_run(run, run.run_dir / "best.pt", None)
            if cfg.snapshot_every and run.epoch % cfg.snapshot_every == 0:
                save_run(run, run.run_dir / f"epoch_{run.epoch:03d}.pt", None)
                prune_snapshots(run.run_dir, cfg.keep)
            write_metrics(run.run_dir / "metrics.jsonl", run.metrics)
        log(info, summary_line(stats, cfg.epochs))
    lkdist.barrier()
    if run.metrics:
        best = max(run.metrics, key=lambda m: m["val_top1"])
        log(
            info,
            f"done: best val top-1 {best['val_top1']:.2f}% at epoch {best['epoch']}; "
            f"checkpoints in {run.run_dir}/ (best.pt, last.pt), history in metrics.jsonl",
        )


def main(argv: list[str] | None = None, prog: str = "python -m lkat_lens.train") -> int:
    """Run the trainer; returns the process exit code (2 for user errors and a non-finite loss)."""
    args = build_parser(prog).parse_args(argv)
    info: lkdist.DistInfo | None = None
    try:
        info = lkdist.setup(args.device)
        train(setup_run(args, info))
        return 0
    except (*USER_ERRORS, NonFiniteLoss, CheckpointWriteError, lkdist.DeviceError) as err:
        if info is None or info.is_main:
            print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    finally:
        lkdist.teardown()


if __name__ == "__main__":
    raise SystemExit(main())
