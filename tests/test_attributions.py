"""Attributions (captum) with known answers: completeness, gradients, occlusion, maps, deletion/insertion curves."""

import json

import pytest
import torch
from tolerance import assert_close
from torch import nn

import lkat_lens
from lkat_lens.analyses.attributions import (
    METHODS,
    Attribution,
    attribute,
    blurred,
    curve_auc,
    deletion_insertion,
    patch_map,
    pixel_map,
)
from lkat_lens.analyses.parts import patch_size

B, C, IMG, PATCH = 2, 3, 16, 4
GRID = IMG // PATCH


def patch_mask(row: int, col: int) -> torch.Tensor:
    """[C, IMG, IMG] ones on one patch, zeros elsewhere."""
    mask = torch.zeros(C, IMG, IMG)
    mask[:, row * PATCH : (row + 1) * PATCH, col * PATCH : (col + 1) * PATCH] = 1
    return mask


def linear_model(weights: torch.Tensor) -> nn.Module:
    """logits = W x: weights [K, C, IMG, IMG]."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(C * IMG * IMG, weights.shape[0], bias=False))
    with torch.no_grad():
        model[1].weight.copy_(weights.flatten(1))
    return model.eval()


def one_patch_model(row: int = 1, col: int = 2) -> tuple[nn.Module, torch.Tensor]:
    """Two classes: logit 0 reads one patch through random weights, logit 1 is always 0."""
    w = torch.randn(C, IMG, IMG, generator=torch.Generator().manual_seed(2)) * patch_mask(row, col)
    return linear_model(torch.stack([w, torch.zeros_like(w)])), w


def target_logit_grad(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """d logit[b, target_b] / dx by plain autograd."""
    x = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(model(x).gather(1, target[:, None]).sum(), x)
    return grad


def test_integrated_gradients_completeness_on_lkat(lkat, images):
    baseline = 0.5 * images  # a dimmed image; see the report on the zero baseline of an untrained LKAT
    attr = attribute(lkat, images, "integrated_gradients", baselines=baseline, n_steps=128, internal_batch_size=128)
    with torch.no_grad():
        gap = (lkat(images) - lkat(baseline)).gather(1, attr.target[:, None])[:, 0]
    total = attr.pixel_map.sum((1, 2))
    assert (gap.abs() > 0.05).all()
    assert ((total - gap).abs() <= 0.01 * gap.abs()).all(), (total, gap)
    assert_close(attr.attributions.sum((1, 2, 3)), total)
    assert_close(attr.patch_map.sum((1, 2)), total)
    assert attr.convergence_delta.abs().max() <= 0.01 * gap.abs().min()
    assert torch.equal(attr.target, lkat(images).argmax(-1))
    assert attr.attributions.shape == (B, C, IMG, IMG)
    assert attr.pixel_map.shape == (B, IMG, IMG) and attr.patch_map.shape == (B, GRID, GRID)
    assert attr.patch_size == (PATCH, PATCH)


def test_integrated_gradients_default_baseline_is_zero_on_a_linear_model(images):
    weights = torch.randn(3, C, IMG, IMG, generator=torch.Generator().manual_seed(3))
    model = linear_model(weights)
    attr = attribute(model, images, "integrated_gradients", patch_size=PATCH, n_steps=8)
    predicted = model(images).argmax(-1)
    assert torch.equal(attr.target, predicted)
    assert_close(attr.attributions, images * weights[predicted])
    assert attr.convergence_delta.abs().max() < 1e-4


def test_saliency_is_the_target_logit_gradient(lkat, images):
    target = torch.tensor([3, 7])
    grad = target_logit_grad(lkat, images, target)
    signed = attribute(lkat, images, "saliency", target=target, abs=False)
    assert_close(signed.attributions, grad, rtol=1e-5, atol=1e-7)
    default = attribute(lkat, images, "saliency", target=target)
    assert_close(default.attributions, grad.abs(), rtol=1e-5, atol=1e-7)
    assert torch.equal(default.target, target) and default.convergence_delta is None


def test_input_x_gradient_is_input_times_gradient(lkat, images):
    grad = target_logit_grad(lkat, images, torch.tensor([5, 5]))
    attr = attribute(lkat, images, "input_x_gradient", target=5)
    assert_close(attr.attributions, images * grad, rtol=1e-5, atol=1e-7)


def test_occlusion_on_a_one_patch_model_attributes_only_that_patch(images):
    model, w = one_patch_model(row=1, col=2)
    attr = attribute(model, images, "occlusion", target=0, patch_size=PATCH)
    read = (images * w).sum((1, 2, 3))  # the logit drop when the patch is replaced by zeros
    expected = torch.zeros(B, GRID, GRID)
    expected[:, 1, 2] = C * PATCH * PATCH * read  # captum gives every element of the window the drop
    assert_close(attr.patch_map, expected)
    outside = 1 - patch_mask(1, 2)  # windows that miss the patch change the logit only by float32 rounding
    rounding = 1e-5 * attr.attributions.abs().max().item()
    assert_close(attr.attributions * outside, torch.zeros_like(images), rtol=0, atol=rounding)


def test_gradient_shap_and_smoothgrad_on_a_linear_model(images):
    weights = torch.randn(2, C, IMG, IMG, generator=torch.Generator().manual_seed(4))
    model = linear_model(weights)
    shap = attribute(model, images, "gradient_shap", target=1, patch_size=PATCH, n_samples=4)
    assert_close(shap.attributions, images * weights[1])  # zero baseline, no noise
    assert shap.convergence_delta.shape == (B * 4,)
    smooth = attribute(model, images, "smoothgrad", target=1, patch_size=PATCH, nt_samples=4)
    assert_close(smooth.attributions, weights[1].abs().expand(B, -1, -1, -1))
    smooth_ig = attribute(
        model, images, "smoothgrad", target=1, patch_size=PATCH, smooth_over="integrated_gradients", stdevs=1e-12
    )
    assert_close(smooth_ig.attributions, images * weights[1])


def test_every_method_runs_on_lkat_and_keeps_the_training_flag(lkat, images):
    lkat.train()
    try:
        for method in METHODS:
            kwargs = {"n_steps": 4} if method == "integrated_gradients" else {}
            kwargs |= {"nt_samples": 2} if method == "smoothgrad" else {}
            attr = attribute(lkat, images, method, **kwargs)
            assert attr.pixel_map.shape == (B, IMG, IMG) and torch.isfinite(attr.attributions).all()
            assert lkat.training
            json.dumps(attr.to_dict())
    finally:
        lkat.eval()


def test_passes_of_bounded_size_give_the_single_pass_result(lkat, images):
    chunked = attribute(lkat, images, "integrated_gradients", n_steps=40)  # 2 passes of 64 path points
    single = attribute(lkat, images, "integrated_gradients", n_steps=40, internal_batch_size=80)
    assert_close(chunked.attributions, single.attributions, rtol=1e-4, atol=1e-6)
    grouped = attribute(lkat, images, "occlusion")  # 16 patches occluded in one pass
    one_by_one = attribute(lkat, images, "occlusion", perturbations_per_eval=1)
    assert_close(grouped.attributions, one_by_one.attributions, rtol=1e-4, atol=1e-6)
    noisy_ig = attribute(lkat, images, "smoothgrad", smooth_over="integrated_gradients", nt_samples=2, n_steps=4)
    assert noisy_ig.attributions.shape == images.shape and torch.isfinite(noisy_ig.attributions).all()


def test_pixel_and_patch_maps_sum_exactly():
    raw = torch.arange(B * C * IMG * IMG, dtype=torch.float64).reshape(B, C, IMG, IMG) - 700.0
    pixels = pixel_map(raw, "sum")
    assert_close(pixels, raw[:, 0] + raw[:, 1] + raw[:, 2])
    assert_close(pixel_map(raw, "abs_sum"), raw.abs().sum(1))
    patches = patch_map(pixels, PATCH)
    assert patches.shape == (B, GRID, GRID)
    assert patches[1, 2, 3] == pixels[1, 8:12, 12:16].sum()
    assert torch.equal(patches.sum((1, 2)), pixels.sum((1, 2)))
    with pytest.raises(ValueError, match="patches"):
        patch_map(pixels, 5)
    with pytest.raises(ValueError, match="reduction"):
        pixel_map(raw, "max")


def test_curve_auc_is_the_trapezoid_rule():
    fractions = torch.tensor([0.0, 0.25, 0.5, 1.0])
    values = torch.tensor([[1.0, 0.5, 0.5, 0.0], [1.0, 1.0, 1.0, 1.0]])
    assert_close(curve_auc(fractions, values), torch.tensor([0.4375, 1.0]))


def test_deletion_of_a_perfect_attribution_drops_first():
    model, w = one_patch_model(row=1, col=2)
    images = 3.0 * w.sign().expand(B, -1, -1, -1)  # logit 0 = 3 sum|w| on the patch, far above logit 1 = 0
    p_full = torch.sigmoid(3.0 * w.abs().sum())
    perfect = torch.zeros(B, GRID, GRID)
    perfect[:, 1, 2] = 1.0
    steps = GRID * GRID
    curves = deletion_insertion(model, images, perfect, steps, replacement="zeros", target=0, patch_size=PATCH)
    expected_deletion = torch.full((B, steps + 1), 0.5)
    expected_deletion[:, 0] = p_full
    expected_insertion = torch.full((B, steps + 1), p_full.item())
    expected_insertion[:, 0] = 0.5
    assert_close(curves.fractions, torch.arange(steps + 1) / steps)
    assert_close(curves.deletion, expected_deletion)
    assert_close(curves.insertion, expected_insertion)
    assert_close(curves.deletion_auc, torch.full((B,), 0.5 + (p_full.item() - 0.5) / (2 * steps)))
    worst = 1.0 - perfect  # the patch that matters comes last
    late = deletion_insertion(model, images, worst, steps, replacement="zeros", target=0, patch_size=PATCH)
    assert_close(late.deletion[:, :-1], torch.full((B, steps), p_full.item()))
    assert (late.deletion_auc > curves.deletion_auc + 0.4).all()
    assert (late.insertion_auc < curves.insertion_auc - 0.4).all()


def test_deletion_insertion_end_points_on_lkat(lkat, images):
    attr = attribute(lkat, images, "saliency")
    with torch.no_grad():
        p_image = lkat(images).softmax(-1).gather(1, attr.target[:, None])[:, 0]
        p_blur = lkat(blurred(images, float(PATCH))).softmax(-1).gather(1, attr.target[:, None])[:, 0]
    for unit, steps in (("patch", 4), ("pixel", 8)):
        curves = deletion_insertion(lkat, images, attr, steps, unit=unit, batch_size=5)
        assert curves.deletion.shape == curves.insertion.shape == (B, steps + 1)
        assert_close(curves.deletion[:, 0], p_image)
        assert_close(curves.insertion[:, -1], p_image)
        assert_close(curves.deletion[:, -1], p_blur)
        assert_close(curves.insertion[:, 0], p_blur)
        assert_close(curves.deletion_auc, curve_auc(curves.fractions, curves.deletion))
        assert json.loads(json.dumps(curves.to_dict()))["unit"] == unit


def test_patch_deletion_follows_the_pixel_map_order(lkat, images):
    attr = attribute(lkat, images, "input_x_gradient", reduction="abs_sum")
    from_attr = deletion_insertion(lkat, images, attr, 4, replacement="mean")
    from_pixels = deletion_insertion(lkat, images, attr.pixel_map, 4, replacement="mean", target=attr.target)
    assert_close(from_attr.deletion, from_pixels.deletion)
    assert_close(from_attr.insertion, from_pixels.insertion)


def test_model_patch_size_and_errors(lkat, images):
    assert patch_size(lkat) == (PATCH, PATCH)
    vit = lkat_lens.create_model("vit_tiny_patch16_224", num_classes=3, img_size=IMG, patch_size=8, depth=1)
    assert patch_size(vit) == (8, 8)
    with pytest.raises(ValueError, match="patch_size"):
        patch_size(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="unknown attribution method"):
        attribute(lkat, images, "lime")
    with pytest.raises(ValueError, match="target has 3"):
        attribute(lkat, images, "saliency", target=[1, 2, 3])
    with pytest.raises(ValueError, match="steps"):
        deletion_insertion(lkat, images, torch.zeros(B, GRID, GRID), steps=GRID * GRID + 1)
    assert isinstance(attribute(lkat, images[:1], "saliency"), Attribution)


def test_integrated_gradients_chooses_its_steps_until_it_converges(digits_checkpoint):
    """Default IG doubles its steps until |delta| <= 5 % of |f(x) - f(baseline)|; the delta is checked in torch."""
    from lkat_lens.analyses.attributions import IG_STEPS, IG_TOLERANCE
    from lkat_lens.checkpoint import load
    from lkat_lens.data import load_sample

    model, info = load(digits_checkpoint)
    x = load_sample(info.data, "val", 4).images
    attr = attribute(model, x, "integrated_gradients")
    with torch.no_grad():
        logits, base = model(x), model(torch.zeros_like(x))
    rows = torch.arange(4)
    gap = logits[rows, attr.target] - base[rows, attr.target]
    delta = attr.attributions.sum((1, 2, 3)) - gap  # captum's delta, computed independently
    assert_close(attr.convergence_delta, delta, rtol=1e-4, atol=1e-5)
    assert_close(attr.delta_ratio, delta.abs() / gap.abs(), rtol=1e-3, atol=1e-6)
    assert attr.converged and bool((attr.delta_ratio <= IG_TOLERANCE).all())
    assert attr.steps >= IG_STEPS[0] and attr.steps % IG_STEPS[0] == 0
    coarse = attribute(model, x, "integrated_gradients", n_steps=2)  # a fixed step count is kept, and judged
    assert coarse.steps == 2 and coarse.converged == bool((coarse.delta_ratio <= IG_TOLERANCE).all())
    report = attr.to_dict(pixels=False)
    assert report["converged"] is True and report["steps"] == attr.steps and "0.05" in report["convergence_rule"]
