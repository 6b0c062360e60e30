"""The Study on CUDA agrees with the Study on the CPU: every analysis, 1e-3 relative (fla's chunked GLA runs in
fp32 within 1e-3 of the exact recurrence), attributions by their top patches."""

from __future__ import annotations

import pytest
import torch

from lkat_lens.study import Study

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def close(gpu: torch.Tensor, cpu: torch.Tensor, rel: float = 1e-3, floor: float = 1e-12) -> None:
    """Within `rel` of the largest value compared (the values' scale, not each element's), or of `floor`."""
    scale = max(float(cpu.double().abs().max()), floor)
    diff = float((gpu.double() - cpu.double()).abs().max())
    assert diff <= rel * scale, f"{diff:.3g} > {rel} x {scale:.3g}"


@pytest.fixture(scope="module")
def studies(digits_checkpoint) -> tuple[Study, Study]:
    settings = {"num_images": 48, "probe_images": 64, "attribution_images": 2, "edges": 4, "batch_size": 16}
    return Study.open(digits_checkpoint, device="cuda", **settings), Study.open(
        digits_checkpoint, device="cpu", **settings
    )


def test_statistics_agree(studies):
    gpu, cpu = studies
    assert gpu.device.type == "cuda" and cpu.device.type == "cpu"
    for name, stats in cpu.layer_statistics().items():
        other = gpu.layer_statistics()[name]
        assert other.input_mean.device.type == "cpu"  # results come back on the CPU
        close(other.input_mean, stats.input_mean)
        close(other.output_std, stats.output_std, floor=1e-6)  # a barely trained fc2's output is ~1e-10: round-off
        assert abs(other.coverage.outside_fraction - stats.coverage.outside_fraction) <= 1e-3
    for block in range(cpu.num_blocks):
        close(gpu.edge_importance(block, "fc1").edge_std, cpu.edge_importance(block, "fc1").edge_std)
    close(gpu.gate_statistics().log_alpha, cpu.gate_statistics().log_alpha)
    close(gpu.gate_statistics().log_alpha_map, cpu.gate_statistics().log_alpha_map)
    close(gpu.token_norms().norms, cpu.token_norms().norms)
    close(gpu.attention(2, 0).matrices, cpu.attention(2, 0).matrices)
    close(gpu.cls_attention_maps().rows, cpu.cls_attention_maps().rows)
    assert gpu.span_shares() == pytest.approx(cpu.span_shares(), abs=1e-3)


def test_attributions_pick_the_same_top_patches(studies):
    gpu, cpu = studies
    for method in ("saliency", "integrated_gradients"):
        a, b = gpu.attribution(slice(0, 2), method), cpu.attribution(slice(0, 2), method)
        top_gpu = a.patch_map.flatten(1).topk(3).indices.sort().values
        top_cpu = b.patch_map.flatten(1).topk(3).indices.sort().values
        assert torch.equal(top_gpu, top_cpu), method


def test_probes_and_accuracy_agree(studies):
    gpu, cpu = studies
    assert gpu.sample_top1 == pytest.approx(cpu.sample_top1, abs=100 / 48 + 1e-9)  # at most one image flips
    acc_gpu, acc_cpu = gpu.probes().test_accuracy, cpu.probes().test_accuracy
    for kind, values in acc_cpu.items():
        assert all(abs(g - c) <= 2 / 48 + 1e-9 for g, c in zip(acc_gpu[kind], values, strict=True)), kind
