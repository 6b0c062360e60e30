"""GLA gate statistics: half-lives of planted constant gates, token-type split, patch maps, quantiles, histogram."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from tolerance import assert_close

from lkat_lens.analyses.gates import gate_statistics, half_life
from lkat_lens.models import RbfKAT

B, IMG, N, R = 2, 16, 16, 4
PATCH_ALPHAS = [0.5 + 0.03 * p for p in range(N)]
REGISTER_ALPHAS = [0.8, 0.85, 0.9, 0.95]


def f32_log(alpha: float) -> torch.Tensor:
    """ln alpha as the fp32 value a gate hook would carry."""
    return torch.tensor(math.log(alpha), dtype=torch.float32)


def expected_half_life(alpha: float) -> float:
    """ln 0.5 / ln alpha with ln alpha rounded to fp32 as in the model."""
    return math.log(0.5) / f32_log(alpha).double().item()


def planted_gates(gk: torch.Tensor, hook) -> torch.Tensor:
    """Log gates set per token: patch p -> PATCH_ALPHAS[p], register j -> REGISTER_ALPHAS[j], class token -> 1."""
    logs = [math.log(a) for a in PATCH_ALPHAS + REGISTER_ALPHAS] + [0.0]
    return torch.tensor(logs, dtype=gk.dtype)[None, :, None, None].expand_as(gk).clone()


def test_constant_gate_gives_its_half_life_exactly(lkat, images):
    alpha = 0.9
    with lkat.hooks(
        fwd_hooks=[(lambda n: n.endswith("hook_gk"), lambda gk, hook: torch.full_like(gk, math.log(alpha)))]
    ):
        stats = gate_statistics(lkat, images)
    want = expected_half_life(alpha)
    assert want == pytest.approx(6.578813478960585, rel=1e-6)
    assert torch.all(stats.half_life == want)
    assert torch.all(stats.half_life_quantiles == want)
    assert torch.all(stats.half_life_map == want)
    assert all(torch.all(h == want) for h in stats.half_life_by_type.values())
    assert torch.all(stats.alpha == f32_log(alpha).double().exp())
    assert stats.hist_counts.sum(-1).unique().tolist() == [B * (N + R + 1) * 32]


def test_half_life_split_by_token_type_and_mapped_over_patches(lkat, images):
    with lkat.hooks(fwd_hooks=[(lambda n: n.endswith("hook_gk"), planted_gates)]):
        stats = gate_statistics(lkat, images)
    assert stats.blocks == [0, 1, 2, 3]
    assert set(stats.half_life_by_type) == {"patches", "register_0", "register_1", "register_2", "register_3", "cls"}
    for j, alpha in enumerate(REGISTER_ALPHAS):
        assert torch.all(stats.half_life_by_type[f"register_{j}"] == expected_half_life(alpha))
        assert torch.all(stats.head_half_life_by_type[f"register_{j}"] == expected_half_life(alpha))
    assert torch.all(stats.half_life_by_type["cls"] == math.inf)
    want_map = torch.tensor([expected_half_life(a) for a in PATCH_ALPHAS], dtype=torch.float64).view(4, 4)
    assert stats.half_life_map.shape == (4, 2, 4, 4)
    assert torch.all(stats.half_life_map == want_map)
    patch_mean = torch.stack([f32_log(a) for a in PATCH_ALPHAS]).double().mean()
    assert_close(
        stats.half_life_by_type["patches"],
        torch.full((4, 2, 32), math.log(0.5) / patch_mean.item(), dtype=torch.float64),
        rtol=1e-12,
        atol=0,
    )
    # quantiles over images and tokens: the minimum is patch 0's gate, the maximum the class token's (alpha = 1)
    assert torch.all(stats.half_life_quantiles[..., 0] == expected_half_life(PATCH_ALPHAS[0]))
    assert torch.all(stats.half_life_quantiles[..., -1] == math.inf)
    report = stats.to_dict()
    json.dumps(report, allow_nan=False)
    assert report["head_half_life_by_type"]["cls"] == [[None, None]] * 4


def test_half_life_function():
    logs = torch.tensor([math.log(0.5), math.log(0.25), 0.0, -math.inf], dtype=torch.float64)
    assert half_life(logs).tolist() == [1.0, 0.5, math.inf, 0.0]


def test_statistics_match_the_cached_gates(lkat, images):
    stats = gate_statistics(lkat, images, bins=16)
    _, cache = lkat.run_with_cache(images, names=lambda n: n.endswith("hook_gk"))
    gk = torch.stack([cache["hook_gk", i] for i in range(4)]).double()  # [L, B, T, H, dk]
    assert_close(stats.log_alpha, gk.mean((1, 2)), rtol=1e-12, atol=0)
    samples = gk.permute(0, 3, 4, 1, 2).flatten(3).exp()
    want = torch.quantile(samples, stats.quantile_levels, dim=-1, interpolation="nearest").permute(1, 2, 3, 0)
    assert torch.equal(stats.alpha_quantiles, want)
    counts, edges = np.histogram(samples[2, 1].numpy(), bins=stats.hist_edges.numpy())
    assert stats.hist_counts[2, 1].tolist() == counts.tolist()
    assert stats.hist_edges[0] == samples.min() and stats.hist_edges[-1] == samples.max()
    assert torch.all(stats.half_life > 0) and torch.all(stats.half_life.isfinite())


def test_models_without_gla_are_refused(images):
    model = RbfKAT(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=10).eval()
    with pytest.raises(ValueError, match="no GLA blocks"):
        gate_statistics(model, images)


def test_streamed_in_batches_equals_one_pass(lkat):
    """Issue 15: batches of 2 give the one-pass statistics; the quantiles cover only the first quantile_images."""
    images = torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    whole = gate_statistics(lkat, images, bins=8)
    streamed = gate_statistics(lkat, images, bins=8, batch_size=2)
    for field in ("log_alpha", "log_alpha_map"):
        assert_close(getattr(streamed, field), getattr(whole, field), rtol=1e-12, atol=1e-12)
    for name, value in whole.log_alpha_by_type.items():
        assert_close(streamed.log_alpha_by_type[name], value, rtol=1e-12, atol=1e-12)
    assert torch.equal(streamed.log_alpha_quantiles, whole.log_alpha_quantiles)
    assert torch.equal(streamed.hist_counts, whole.hist_counts)
    few = gate_statistics(lkat, images, bins=8, batch_size=2, quantile_images=3)
    assert torch.equal(few.log_alpha_quantiles, gate_statistics(lkat, images[:3], bins=8).log_alpha_quantiles)
    assert_close(few.log_alpha, whole.log_alpha, rtol=1e-12, atol=1e-12)  # the means still see all five
