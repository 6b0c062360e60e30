"""Recipes carry the paper's tables: built timm transforms, Mixup, loss, optimizer and schedule inspected."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from timm.data.auto_augment import _RAND_INCREASING_TRANSFORMS, RandAugment
from timm.data.mixup import Mixup
from timm.data.random_erasing import RandomErasing
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from tolerance import assert_close
from torch import nn
from torchvision import transforms

from lkat_lens import create_model
from lkat_lens import data as lkdata
from lkat_lens import recipe as lkrecipe

BICUBIC = transforms.InterpolationMode.BICUBIC


def test_deit_train_transform_matches_table():
    """Paper Table "Shared from-scratch setup" / "Data preprocessing", built at S = 224."""
    mean, std = lkdata.NORMALIZATION["cifar10"]
    steps = lkrecipe.build_train_transform(lkrecipe.DEIT, 224, mean, std).transforms
    assert [type(s) for s in steps] == [
        transforms.Resize,
        transforms.RandomCrop,
        transforms.RandomHorizontalFlip,
        RandAugment,
        transforms.ToTensor,
        transforms.Normalize,
        RandomErasing,
    ]
    resize, crop, flip, ra, _, norm, erase = steps
    assert resize.size == 224 and resize.interpolation == BICUBIC
    assert crop.size == (224, 224) and crop.padding == 4 and crop.padding_mode == "reflect"
    assert flip.p == 0.5
    # rand-m9-mstd0.5-inc1: two ops per image from the "increasing" set, magnitude 9 with std 0.5.
    assert ra.num_layers == 2 and ra.choice_weights is None
    assert [op.name for op in ra.ops] == _RAND_INCREASING_TRANSFORMS
    assert {(op.magnitude, op.magnitude_std, op.prob) for op in ra.ops} == {(9, 0.5, 0.5)}
    assert ra.ops[0].hparams["translate_const"] == int(224 * 0.45)
    assert tuple(norm.mean) == mean and tuple(norm.std) == std
    assert (erase.probability, erase.min_area, erase.max_area, erase.mode) == (0.25, 0.02, 0.1, "const")


def test_deit_eval_transform_matches_table():
    steps = lkrecipe.build_eval_transform(lkrecipe.DEIT, 224, (0.5,) * 3, (0.5,) * 3).transforms
    assert steps[0].size == math.floor(224 / 0.875) == 256 and steps[0].interpolation == BICUBIC
    assert steps[1].size == (224, 224)


def test_deit_mixup_and_loss_match_table():
    mixup = lkrecipe.build_mixup(lkrecipe.DEIT, num_classes=100)
    assert isinstance(mixup, Mixup)
    assert (mixup.mixup_alpha, mixup.cutmix_alpha, mixup.mix_prob, mixup.switch_prob) == (0.8, 1.0, 1.0, 0.5)
    assert (mixup.mode, mixup.label_smoothing, mixup.num_classes) == ("batch", 0.1, 100)
    assert isinstance(lkrecipe.build_loss(lkrecipe.DEIT), SoftTargetCrossEntropy)


def test_mixup_and_cutmix_batches_are_exact():
    """Each batch is Mixup or CutMix with the flipped batch; soft targets carry smoothing 0.1 and lam."""
    mixup = lkrecipe.build_mixup(lkrecipe.DEIT, num_classes=10)
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    on, off = 1 - 0.1 + 0.01, 0.01
    seen = set()
    for seed in range(12):
        np.random.seed(seed)
        out, soft = mixup(x.clone(), y)
        lam = (soft[0, 0].item() - off) / (on - off)  # row 0 mixes class 0 (lam) with class 3, the flipped row
        expected = torch.full((10,), off)
        expected[0], expected[3] = off + lam * (on - off), off + (1 - lam) * (on - off)
        assert_close(soft[0], expected)
        if torch.allclose(out[0], lam * x[0] + (1 - lam) * x[3], atol=1e-6):
            seen.add("mixup")
        else:
            from_flip = (out[0] == x[3]).all(0)
            assert (from_flip | (out[0] == x[0]).all(0)).all()
            assert from_flip.float().mean().item() == pytest.approx(1 - lam, abs=1e-6)
            seen.add("cutmix")
    assert seen == {"mixup", "cutmix"}


def test_deit_optimizer_matches_table():
    model = create_model("lkat_micro", num_classes=10, img_size=16)
    rec = lkrecipe.DEIT
    opt = lkrecipe.build_optimizer(model, rec, lr=rec.lr, weight_decay=rec.weight_decay)
    assert isinstance(opt, torch.optim.AdamW)
    assert {g["lr"] for g in opt.param_groups} == {3e-4} and {g["weight_decay"] for g in opt.param_groups} == {0.0}
    assert opt.defaults["betas"] == (0.9, 0.999)


def test_weight_decay_skips_biases_norms_and_tokens():
    model = create_model("lkat_micro", num_classes=10, img_size=16)
    opt = lkrecipe.build_optimizer(model, lkrecipe.FINETUNE_B, lr=1e-4, weight_decay=0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert {g["weight_decay"] for g in opt.param_groups} == {0.0, 0.05}
    assert "pos_embed" not in decayed and "cls_token" not in decayed and "head.bias" not in decayed
    assert "head.weight" in decayed and "blocks.0.mlp.fc1.dim_linear.weight" in decayed


def test_schedule_is_linear_warmup_then_cosine_to_min_lr():
    """5 warmup epochs from 1e-6 to 3e-4, cosine to 1e-5 over the run, stepped every update."""
    param = nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=3e-4)
    epochs, per_epoch, rec = 10, 4, lkrecipe.DEIT
    sched = lkrecipe.build_scheduler(
        opt, rec, epochs=epochs, warmup_epochs=rec.warmup_epochs, updates_per_epoch=per_epoch
    )
    assert (sched.t_initial, sched.warmup_t, sched.lr_min, sched.warmup_lr_init) == (40, 20, 1e-5, 1e-6)
    total, warm = epochs * per_epoch, rec.warmup_epochs * per_epoch

    def expected(t: int) -> float:
        if t < warm:
            return 1e-6 + t * (3e-4 - 1e-6) / warm
        return 1e-5 + 0.5 * (3e-4 - 1e-5) * (1 + math.cos(math.pi * t / total))

    assert opt.param_groups[0]["lr"] == pytest.approx(1e-6, rel=1e-12)
    for t in range(1, total + 1):
        sched.step_update(t)
        assert opt.param_groups[0]["lr"] == pytest.approx(expected(t), rel=1e-12), t
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-5, rel=1e-12)


def test_finetune_presets_match_table():
    """Paper Table "CIFAR fine-tuning recipe": shared AdamW 1e-4, DeiT aug, Mixup/CutMix 0.8/1.0."""
    a, b = lkrecipe.get_recipe("finetune-a"), lkrecipe.get_recipe("finetune-b")
    for r in (a, b):
        assert (r.opt, r.lr, r.mixup_alpha, r.cutmix_alpha) == ("adamw", 1e-4, 0.8, 1.0)
        assert (r.auto_augment, r.re_prob, r.pad, r.hflip) == ("rand-m9-mstd0.5-inc1", 0.25, 4, 0.5)
    assert (a.weight_decay, a.drop_path, a.model_kwargs) == (0.0, 0.0, {"kan_layernorm": True})
    assert (b.weight_decay, b.drop_path, b.model_kwargs) == (0.05, 0.1, {"kan_layernorm": False})
    assert lkrecipe.default_recipe("cifar10", finetune=True) == "finetune-b"


def test_deit_epochs_per_dataset():
    assert [lkrecipe.epochs_for(lkrecipe.DEIT, d) for d in ("cifar10", "cifar100", "imagefolder")] == [
        100,
        200,
        300,
    ]
    assert lkrecipe.DEIT.batch_size == 256


def test_digits_recipe_is_light():
    rec = lkrecipe.get_recipe("digits")
    assert lkrecipe.default_recipe("digits", finetune=False) == "digits"
    assert lkrecipe.build_mixup(rec, 10) is None and not rec.mixes
    loss = lkrecipe.build_loss(rec)
    assert isinstance(loss, LabelSmoothingCrossEntropy) and loss.smoothing == 0.1
    steps = lkrecipe.build_train_transform(rec, 16, (0.5,) * 3, (0.5,) * 3).transforms
    assert [type(s) for s in steps] == [
        transforms.Resize,
        transforms.RandomCrop,
        transforms.ToTensor,
        transforms.Normalize,
    ]
    assert steps[1].padding == 2
    assert lkrecipe.build_eval_transform(rec, 16, (0.5,) * 3, (0.5,) * 3).transforms[0].size == 16


def test_plain_recipe_has_no_randomness():
    rec = lkrecipe.get_recipe("plain")
    assert lkrecipe.build_mixup(rec, 10) is None
    assert isinstance(lkrecipe.build_loss(rec), nn.CrossEntropyLoss)
    tf = lkrecipe.build_train_transform(rec, 16, (0.5,) * 3, (0.5,) * 3)
    assert [type(s) for s in tf.transforms] == [
        transforms.Resize,
        transforms.RandomCrop,
        transforms.ToTensor,
        transforms.Normalize,
    ]


def test_unknown_recipe():
    with pytest.raises(lkrecipe.RecipeError, match="unknown recipe 'fast'; choose from deit, digits"):
        lkrecipe.get_recipe("fast")
