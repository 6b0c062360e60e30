"""Interventions on CUDA (issue 17): patching, ablation and DLA agree with the CPU (fla's GLA and the Triton KAN
kernels against the exact torch paths) and DLA still sums to the logit."""

from __future__ import annotations

import copy

import pytest
import torch

import lkat_lens
from lkat_lens.analyses import interventions as iv

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def close(gpu: torch.Tensor, cpu: torch.Tensor, rel: float = 1e-3) -> None:
    """Within `rel` of the largest value compared (nan where both are nan)."""
    gpu, cpu = gpu.double().nan_to_num(), cpu.double().nan_to_num()
    scale = max(float(cpu.abs().max()), 1.0)
    diff = float((gpu - cpu).abs().max())
    assert diff <= rel * scale, f"{diff:.3g} > {rel} x {scale:.3g}"


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    cpu = lkat_lens.create_model("lkat_tiny_patch16_224", num_classes=10, img_size=64, depth=3).eval()
    return copy.deepcopy(cpu).cuda(), cpu


def test_patching_and_ablation_on_cuda_match_the_cpu(models):
    gpu, cpu = models
    g = torch.Generator().manual_seed(0)
    clean, corrupted, reference = (torch.randn(n, 3, 64, 64, generator=g) for n in (1, 1, 4))
    for point in ("resid_pre", "heads", "gate"):
        a, b = (iv.activation_patching(m, clean, corrupted, point) for m in (gpu, cpu))
        close(a.patched, b.patched)
    a, b = (iv.ablate(m, clean, "heads", reference=reference) for m in (gpu, cpu))
    close(a.ablated, b.ablated)
    restore = iv.patch_residual(gpu, clean, corrupted, "resid_post", blocks=[-1], units=[gpu.token_layout["cls"].start])
    assert abs(restore.values.item() - 1.0) < 1e-4


def test_dla_sums_to_the_logit_on_cuda(models):
    gpu, _ = models
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    dla = iv.direct_logit_attribution(gpu, images)
    assert (dla.logit - dla.model_logit).abs().max() <= 1e-5 * max(1.0, float(dla.model_logit.abs().max()))


def test_lkat_t_224_sweep_of_every_block_and_position(models):
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_tiny_patch16_224", num_classes=1000).eval().cuda()
    clean = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    result = iv.activation_patching(model, clean, "noise", "resid_pre")
    assert result.values.shape == (12, 201) and torch.isfinite(result.patched).all()
