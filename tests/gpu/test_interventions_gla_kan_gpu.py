"""GLA gate clamps, state cuts and KAN edge ablations on CUDA (fla's kernels in the blocks not intervened on)
against the same interventions on the CPU (the exact torch forms)."""

from __future__ import annotations

import copy

import pytest
import torch

import lkat_lens
from lkat_lens.analyses.batching import full_fp32
from lkat_lens.analyses.interventions.edges import EdgeAblation
from lkat_lens.analyses.interventions.effects import intervened_logits
from lkat_lens.analyses.interventions.gates import GateClamp, StateCut

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("mode", ["auto", "fused_recurrent"])
def test_interventions_on_cuda_agree_with_the_cpu(mode):
    torch.manual_seed(0)
    cpu = lkat_lens.create_model("lkat_small_patch16_224", num_classes=10).eval()
    gpu = copy.deepcopy(cpu).cuda()
    for block in gpu.blocks:
        block.attn.mode = mode
    images = torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    cases = [
        [],
        [GateClamp(2, 1, alpha=0.0)],
        [GateClamp(5, None, alpha=1.0)],
        [GateClamp(0, 0, 7, alpha=0.0)],
        [StateCut(3, 100)],
        [EdgeAblation.input_channel(cpu, "blocks.4.mlp.fc1", 11)],
    ]
    with full_fp32():
        for interventions in cases:
            want = intervened_logits(cpu, images, *interventions)
            got = intervened_logits(gpu, images, *interventions)
            assert torch.isfinite(got).all()
            scale = want.abs().max().item()
            assert (got - want).abs().max().item() <= 1e-3 * scale, [i.describe() for i in interventions]
