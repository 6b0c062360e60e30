"""Training recipes (the paper's DeiT setup and CIFAR fine-tuning, light digits and shapes ones) from timm's
pieces."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2, param_groups_weight_decay
from timm.scheduler import create_scheduler_v2
from timm.scheduler.scheduler import Scheduler
from torch import nn
from torchvision import transforms

from . import data as lkdata


class RecipeError(ValueError):
    """An unknown recipe name (a user error)."""


@dataclass(frozen=True)
class Recipe:
    """Every value a training run takes from its recipe; CLI flags override the optimisation ones."""

    name: str
    epochs: int | None  # None: the dataset's from-scratch epochs (SCRATCH_EPOCHS)
    batch_size: int  # global batch, split over DDP ranks
    lr: float
    min_lr: float
    warmup_lr: float
    warmup_epochs: int
    weight_decay: float
    opt: str = "adamw"
    # training transform
    pad: int = 4
    pad_fraction: float | None = None  # padding as a fraction of the image size (replaces pad when set)
    pad_mode: str = "reflect"
    hflip: float = 0.5
    auto_augment: str | None = "rand-m9-mstd0.5-inc1"
    re_prob: float = 0.25
    re_scale: tuple[float, float] = (0.02, 0.1)
    interpolation: str = "bicubic"
    # evaluation transform: resize to img_size / crop_pct, then center crop
    crop_pct: float = 0.875
    # batch mixing and loss
    mixup_alpha: float = 0.8
    cutmix_alpha: float = 1.0
    mixup_prob: float = 1.0
    mixup_switch_prob: float = 0.5
    mixup_mode: str = "batch"
    label_smoothing: float = 0.1
    # model overrides (None: the model's default)
    drop_path: float | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def mixes(self) -> bool:
        """Whether batches go through Mixup/CutMix."""
        return self.mixup_prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)


# Paper Table "Shared from-scratch setup" (global batch 256 of its 256/512); epochs per dataset from its last
# row. The table gives no warmup start; 1e-6 is DeiT's.
DEIT = Recipe(
    name="deit",
    epochs=None,
    batch_size=256,
    lr=3e-4,
    min_lr=1e-5,
    warmup_lr=1e-6,
    warmup_epochs=5,
    weight_decay=0.0,
)
SCRATCH_EPOCHS = {"cifar10": 100, "cifar100": 200, "imagefolder": 300, "digits": 100, "shapes": 30}

# Paper Table "CIFAR fine-tuning recipe": AdamW at 1e-4 with the DeiT augmentation and Mixup/CutMix 0.8/1.0;
# R_A: wd 0, drop path 0, KAN LayerNorm on; R_B: wd 0.05, drop path 0.1, KAN LayerNorm off. The table gives no
# epochs or warmup, so the from-scratch epochs and warmup apply.
FINETUNE_A = dataclasses.replace(
    DEIT, name="finetune-a", lr=1e-4, weight_decay=0.0, drop_path=0.0, model_kwargs={"kan_layernorm": True}
)
FINETUNE_B = dataclasses.replace(
    DEIT, name="finetune-b", lr=1e-4, weight_decay=0.05, drop_path=0.1, model_kwargs={"kan_layernorm": False}
)

# Light recipe for 8x8 digits at 16x16: shifts of up to 2 pixels, no flips (digits are not mirror-symmetric),
# no RandAugment/erasing/mixing; trains lkat_micro to >= 95 % in minutes on a CPU.
DIGITS = Recipe(
    name="digits",
    epochs=30,
    batch_size=64,
    lr=2e-3,
    min_lr=1e-5,
    warmup_lr=1e-5,
    warmup_epochs=2,
    weight_decay=0.05,
    pad=2,
    pad_mode="constant",
    hflip=0.0,
    auto_augment=None,
    re_prob=0.0,
    crop_pct=1.0,
    mixup_prob=0.0,
    label_smoothing=0.1,
)

# Light recipe for the procedural shapes set (objects already sit at random places, sizes, rotations and
# colours): shifts of up to 1/16 of the side over a black border (reflecting would mirror an object at the edge
# into a second, cut-off form), horizontal flips (no class changes under a mirror), no RandAugment (its
# shears and posterisation deform forms), no erasing (it can hide the object), no mixing (a blend shows two
# objects). Evaluation sees the whole image (crop_pct 1: a centre crop could cut the object).
SHAPES = Recipe(
    name="shapes",
    epochs=30,
    batch_size=128,
    lr=1e-3,
    min_lr=1e-5,
    warmup_lr=1e-6,
    warmup_epochs=2,
    weight_decay=0.05,
    pad_fraction=1 / 16,
    pad_mode="constant",
    hflip=0.5,
    auto_augment=None,
    re_prob=0.0,
    crop_pct=1.0,
    mixup_prob=0.0,
    label_smoothing=0.1,
)

# No randomness in the data at all (no crop, flip, augmentation, erasing, mixing, smoothing): for checks such
# as a multi-GPU run against a single-GPU one.
PLAIN = dataclasses.replace(
    DEIT, name="plain", pad=0, hflip=0.0, auto_augment=None, re_prob=0.0, mixup_prob=0.0, label_smoothing=0.0
)

RECIPES: dict[str, Recipe] = {r.name: r for r in (DEIT, DIGITS, FINETUNE_A, FINETUNE_B, PLAIN, SHAPES)}
DEFAULT_RECIPE = {"digits": DIGITS.name, "shapes": SHAPES.name}  # other datasets: deit


def get_recipe(name: str) -> Recipe:
    """The preset recipe called `name`."""
    if name not in RECIPES:
        raise RecipeError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")
    return RECIPES[name]


def default_recipe(dataset: str, finetune: bool) -> str:
    """The recipe a run uses when none is named."""
    if finetune:
        return FINETUNE_B.name
    return DEFAULT_RECIPE.get(dataset, DEIT.name)


def epochs_for(recipe: Recipe, dataset: str) -> int:
    """Number of epochs: the recipe's, else the paper's from-scratch count for the dataset."""
    return recipe.epochs if recipe.epochs is not None else SCRATCH_EPOCHS[dataset]


def build_train_transform(
    recipe: Recipe, img_size: int, mean: Sequence[float], std: Sequence[float]
) -> transforms.Compose:
    """The recipe's training transform at `img_size`."""
    return lkdata.train_transform(
        img_size,
        mean,
        std,
        pad=recipe.pad if recipe.pad_fraction is None else round(recipe.pad_fraction * img_size),
        pad_mode=recipe.pad_mode,
        hflip=recipe.hflip,
        auto_augment=recipe.auto_augment,
        re_prob=recipe.re_prob,
        re_scale=recipe.re_scale,
        interpolation=recipe.interpolation,
    )


def build_eval_transform(
    recipe: Recipe, img_size: int, mean: Sequence[float], std: Sequence[float]
) -> transforms.Compose:
    """The recipe's evaluation transform at `img_size`."""
    return lkdata.eval_transform(img_size, mean, std, crop_pct=recipe.crop_pct, interpolation=recipe.interpolation)


def build_mixup(recipe: Recipe, num_classes: int) -> Mixup | None:
    """timm's Mixup/CutMix (label smoothing folded into the soft targets); None if the recipe mixes none."""
    if not recipe.mixes:
        return None
    return Mixup(
        mixup_alpha=recipe.mixup_alpha,
        cutmix_alpha=recipe.cutmix_alpha,
        prob=recipe.mixup_prob,
        switch_prob=recipe.mixup_switch_prob,
        mode=recipe.mixup_mode,
        label_smoothing=recipe.label_smoothing,
        num_classes=num_classes,
    )


def build_loss(recipe: Recipe) -> nn.Module:
    """Soft-target CE under mixing, else label-smoothing CE (or plain CE without smoothing)."""
    if recipe.mixes:
        return SoftTargetCrossEntropy()
    if recipe.label_smoothing > 0:
        return LabelSmoothingCrossEntropy(smoothing=recipe.label_smoothing)
    return nn.CrossEntropyLoss()


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """timm's weight-decay groups of `model`'s trainable parameters: biases, norms and the model's no_weight_decay()
    set get no decay (what timm's optimizer factory builds from a model)."""
    no_decay = getattr(model, "no_weight_decay", set)()
    return param_groups_weight_decay(model, weight_decay=weight_decay, no_weight_decay_list=no_decay)


def build_optimizer(
    params: nn.Module | list[dict[str, Any]], recipe: Recipe, *, lr: float, weight_decay: float
) -> torch.optim.Optimizer:
    """timm's optimizer factory over a model (grouped by `param_groups`) or over groups of parameters already made."""
    return create_optimizer_v2(params, opt=recipe.opt, lr=lr, weight_decay=weight_decay)


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    recipe: Recipe,
    *,
    epochs: int,
    warmup_epochs: int,
    updates_per_epoch: int,
) -> Scheduler:
    """timm's cosine schedule with linear warmup from warmup_lr, to min_lr, stepped every optimizer update."""
    scheduler, _ = create_scheduler_v2(
        optimizer,
        sched="cosine",
        num_epochs=epochs,
        warmup_epochs=warmup_epochs,
        warmup_lr=recipe.warmup_lr,
        min_lr=recipe.min_lr,
        step_on_epochs=False,
        updates_per_epoch=updates_per_epoch,
    )
    return scheduler
