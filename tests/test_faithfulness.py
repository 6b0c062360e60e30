"""Faithfulness, localisation and randomisation tests of relevance maps, on cases whose answers are known."""

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from sklearn.metrics import average_precision_score

from lkat_lens.analyses import faithfulness, localisation
from lkat_lens.analyses.faithfulness import MAP_METHODS, evaluate_method, randomise_block, spearman
from lkat_lens.analyses.localisation import METRICS, localisation_scores, upsample


def rectangles(n: int = 6, size: int = 16, seed: int = 0) -> torch.Tensor:
    """n masks [n, size, size], each one random axis-aligned rectangle covering 4 to 60 % of the image."""
    gen = torch.Generator().manual_seed(seed)
    masks = torch.zeros(n, size, size, dtype=torch.bool)
    for m in masks:
        h, w = torch.randint(3, size * 3 // 4, (2,), generator=gen).tolist()
        top, left = (
            torch.randint(0, size - h, (1,), generator=gen).item(),
            torch.randint(0, size - w, (1,), generator=gen).item(),
        )
        m[top : top + h, left : left + w] = True
    return masks


def test_an_oracle_map_scores_best_on_every_localisation_metric():
    masks = rectangles()
    oracle = localisation_scores(masks.double(), masks)
    for name in METRICS:
        assert torch.equal(oracle[name], torch.ones(len(masks), dtype=torch.float64)), name
    noise = torch.rand(masks.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    inverted = localisation_scores(1.0 - masks.double(), masks)
    for other in (localisation_scores(noise, masks), inverted):
        for name in METRICS:
            assert (other[name] < oracle[name]).all(), name
    assert inverted["pointing_game"].eq(0).all() and inverted["relevance_mass"].eq(0).all()
    assert inverted["relevance_rank"].eq(0).all() and inverted["pixel_accuracy"].eq(0).all()


def test_a_constant_map_scores_at_chance():
    masks = rectangles()
    area = masks.flatten(1).double().mean(1)
    found = localisation_scores(torch.full(masks.shape, 0.3, dtype=torch.float64), masks)
    for name in ("pointing_game", "relevance_mass", "relevance_rank", "average_precision"):
        torch.testing.assert_close(found[name], area, rtol=1e-12, atol=1e-12, msg=name)
    # binarised at its mean, a constant map marks no pixel as object: every pixel of the background is right
    torch.testing.assert_close(found["pixel_accuracy"], 1 - area, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(found["miou"], (1 - area) / 2, rtol=1e-12, atol=1e-12)


def test_metrics_against_a_plain_per_image_computation():
    masks = rectangles(4, 12, seed=3)
    maps = torch.randn(masks.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    found = localisation_scores(maps, masks)
    for b in range(len(masks)):
        s, t = maps[b].flatten().numpy(), masks[b].flatten().numpy()
        k = int(t.sum())
        assert found["pointing_game"][b] == float(t[s.argmax()])
        assert found["relevance_mass"][b] == pytest.approx(np.clip(s, 0, None)[t].sum() / np.clip(s, 0, None).sum())
        assert found["relevance_rank"][b] == pytest.approx(t[np.argsort(-s)[:k]].mean())
        predicted = s > s.mean()
        assert found["pixel_accuracy"][b] == pytest.approx((predicted == t).mean())
        ious = [(predicted & t).sum() / (predicted | t).sum(), (~predicted & ~t).sum() / (~predicted | ~t).sum()]
        assert found["miou"][b] == pytest.approx(np.mean(ious))
        order = np.argsort(-s)  # no ties: AP = mean over positives of the precision at their rank
        hits = t[order]
        precision_at_hits = np.cumsum(hits)[hits] / (np.flatnonzero(hits) + 1)
        assert found["average_precision"][b] == pytest.approx(precision_at_hits.mean())
        assert found["average_precision"][b] == pytest.approx(average_precision_score(t, s))


def test_pointing_game_tolerance_and_ties():
    masks = torch.zeros(1, 9, 9, dtype=torch.bool)
    masks[0, 4, 4] = True
    maps = torch.zeros(1, 9, 9)
    maps[0, 4, 6] = 1.0  # two pixels right of the object
    assert localisation.pointing_game(maps, masks, tolerance=1).item() == 0
    assert localisation.pointing_game(maps, masks, tolerance=2).item() == 1
    tied = torch.zeros(1, 9, 9)
    tied[0, 4, 4] = tied[0, 0, 0] = tied[0, 8, 8] = tied[0, 2, 2] = 1.0
    assert localisation.pointing_game(tied, masks).item() == 0.25
    empty = localisation_scores(maps, torch.zeros_like(masks))
    assert all(torch.isnan(v).all() for v in empty.values())
    with pytest.raises(ValueError, match="bool"):
        localisation_scores(maps, masks.float())


def test_upsample_keeps_pixel_maps_and_spreads_patch_maps():
    pixels = torch.randn(2, 8, 8)
    assert upsample(pixels, (8, 8)) is pixels
    patch = torch.tensor([[[1.0, 1.0], [1.0, 1.0]], [[0.0, 0.0], [0.0, 4.0]]])
    up = upsample(patch, (8, 8))
    assert up.shape == (2, 8, 8) and torch.allclose(up[0], torch.ones(8, 8))
    # bilinear between patch centres (pixel centre i + 0.5 sits at patch coordinate (i + 0.5) / 4 - 0.5)
    assert up[1, :2, :2].eq(0).all() and up[1, 6:, 6:].eq(4).all()
    coordinate = ((torch.arange(8) + 0.5) / 4 - 0.5).clamp(0, 1)
    torch.testing.assert_close(up[1], 4 * coordinate[:, None] * coordinate[None, :])


def test_spearman_matches_scipy_with_ties():
    gen = torch.Generator().manual_seed(5)
    a = torch.randint(0, 4, (3, 5, 5), generator=gen).float()
    b = a + torch.randint(0, 3, (3, 5, 5), generator=gen).float()
    found = spearman(a, b)
    for i in range(3):
        assert found[i].item() == pytest.approx(
            spearmanr(a[i].flatten().double(), b[i].flatten().double()).statistic, rel=1e-12
        )
    assert torch.equal(spearman(a, a), torch.ones(3, dtype=torch.float64))
    assert torch.isnan(spearman(torch.ones(1, 3, 3), a[:1, :3, :3])).all()


def test_randomise_block_redraws_with_the_tensors_own_scale(lkat):
    block = lkat.blocks[0]
    before = {n: p.detach().clone() for n, p in block.named_parameters()}
    copy = faithfulness.copy.deepcopy(block)
    randomise_block(copy, seed=3)
    for name, param in copy.named_parameters():
        old = before[name].double()
        if old.numel() < 2 or old.std() == 0:  # a single number, or a constant such as an untrained norm weight
            assert torch.equal(param, before[name])
            continue
        assert not torch.equal(param, before[name]), name
        if old.numel() >= 256:
            assert param.double().std().item() == pytest.approx(old.std().item(), rel=0.2, abs=1e-6), name
    assert all(torch.equal(p, before[n]) for n, p in block.named_parameters())  # the original is untouched


def test_negative_perturbation_removes_the_least_relevant_patches_first(lkat, images):
    """Independently: zero the k least relevant patches by hand and read the target probability."""
    maps = torch.randn(2, 4, 4, generator=torch.Generator().manual_seed(6))
    target = torch.tensor([3, 7])
    found = faithfulness.perturbation_scores(lkat, images, maps, target)
    fractions = found["perturbation_fractions"]
    assert fractions.tolist() == [round(s * 16 / 10) / 16 for s in range(11)]  # the share of the 16 patches removed
    with torch.no_grad():
        for s in (0, 3, 5, 10):
            k = round(s * 16 / 10)
            for b in range(2):
                order = maps[b].flatten().argsort()  # least relevant first
                removed = images[b : b + 1].clone()
                positive = images[b : b + 1].clone()
                for patch in order[:k].tolist():
                    r, c = divmod(patch, 4)
                    removed[..., 4 * r : 4 * r + 4, 4 * c : 4 * c + 4] = 0
                for patch in order.flip(0)[:k].tolist():
                    r, c = divmod(patch, 4)
                    positive[..., 4 * r : 4 * r + 4, 4 * c : 4 * c + 4] = 0
                negative_prob = lkat(removed).softmax(-1)[0, target[b]].item()
                positive_prob = lkat(positive).softmax(-1)[0, target[b]].item()
                assert found["negative"][b, s].item() == pytest.approx(negative_prob, rel=1e-5, abs=1e-7)
                assert found["positive"][b, s].item() == pytest.approx(positive_prob, rel=1e-5, abs=1e-7)
    expected = torch.trapezoid(found["negative"], fractions, dim=-1)
    torch.testing.assert_close(found["negative_auc"], expected)


def test_mprt_of_a_map_that_ignores_the_weights_is_one_and_saliency_falls(lkat, images):
    masks = rectangles(2, 16)
    random = evaluate_method(lkat, images, masks, "random", mprt_images=2)
    assert random.mprt_blocks == [3, 2, 1, 0]
    assert torch.equal(random.mprt, torch.ones(4, 2, dtype=random.mprt.dtype))
    saliency = evaluate_method(lkat, images, masks, "saliency", mprt_images=2)
    assert saliency.mprt.shape == (4, 2) and saliency.mprt.max() < 0.99
    assert saliency.summary()["mprt"] < 0.9


def test_every_method_is_scored_in_batches(lkat, images):
    masks = rectangles(2, 16, seed=2)
    cheap = {"integrated_gradients": {"n_steps": 8}, "smoothgrad": {"nt_samples": 2}, "gradient_shap": {"n_samples": 2}}
    for method in MAP_METHODS:
        one = evaluate_method(lkat, images[:1], masks[:1], method, mprt_images=0, settings=cheap.get(method))
        assert set(one.scores) == {*METRICS, *faithfulness.FAITHFULNESS_METRICS}, method
        assert one.curves["positive"].shape == (1, 11) and one.curves["deletion"].shape == (1, 17)
        summary = one.summary()
        assert set(summary) == set(faithfulness.METRICS) and np.isnan(summary["mprt"])
        if method in ("random", "cls_attention"):  # deterministic maps: batching changes nothing
            alone = evaluate_method(lkat, images, masks, method, mprt_images=0, batch_size=1)
            both = evaluate_method(lkat, images, masks, method, mprt_images=0, batch_size=2)
            for name, values in alone.scores.items():
                torch.testing.assert_close(values, both.scores[name], rtol=1e-4, atol=1e-6, msg=name)
                torch.testing.assert_close(values[:1], one.scores[name], rtol=1e-4, atol=1e-6, msg=name)
    with pytest.raises(ValueError, match="unknown map method"):
        evaluate_method(lkat, images, masks, "grad_cam")
    with pytest.raises(ValueError, match="do not match"):
        evaluate_method(lkat, images, masks[:, :8], "saliency")
