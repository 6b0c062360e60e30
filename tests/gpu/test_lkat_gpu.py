"""A whole LKAT-T on CUDA: fla GLA + Triton RBF against the exact torch paths, forward and backward.

fp32: the fast paths equal the torch paths to fp32 rounding. bf16: both the fast paths and the torch paths
under bf16 autocast are compared with the fp32 torch model (the truth); the fast paths may not be less
accurate than the torch paths are in bf16 (whole-model gradients of 12 blocks in bf16 are noisy on both
sides, so a fixed tolerance between two bf16 runs would measure noise, not correctness).
"""

import copy

import pytest
import torch
from model_paths import give_kan_weight, run, worst_grad
from tolerance import rel_norm

import lkat_lens

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.flatten() for g in grads.values()])


@pytest.fixture(scope="module")
def setup():
    """An LKAT-T whose KAN layers carry weight, its fp32 torch-path truth, and a batch."""
    torch.manual_seed(0)
    model = give_kan_weight(lkat_lens.create_model("lkat_tiny_patch16_224", num_classes=100).cuda().train())
    x = torch.randn(4, 3, 224, 224, device="cuda")
    y = torch.randint(0, 100, (4,), device="cuda")
    truth = run(copy.deepcopy(model).set_backends(attn="torch", kan="torch"), x, y, torch.float32)
    return model, x, y, truth


def test_fp32_fused_recurrent_matches_torch(setup):
    """fla's fp32-safe kernel + Triton RBF in fp32 equal the exact torch paths."""
    model, x, y, (logits_ref, grads_ref) = setup
    logits, grads = run(copy.deepcopy(model).set_backends(attn="fused_recurrent", kan="triton"), x, y, torch.float32)
    worst, worst_rel = worst_grad(grads, grads_ref)
    print(
        f"fp32 fused_recurrent: logits rel {rel_norm(logits, logits_ref):.2e}, worst grad {worst} rel {worst_rel:.2e}"
    )
    assert rel_norm(logits, logits_ref) < 1e-4
    assert worst_rel < 1e-3


@pytest.mark.parametrize("attn_mode", ["torch", "chunk", "fused_recurrent"])
def test_bf16_fast_paths_as_accurate_as_torch_paths(setup, attn_mode):
    """Triton RBF (with torch GLA, or with fla's GLA) in bf16 is no less accurate than the torch paths in bf16.

    Checked: the logits and the whole gradient vector; with the Triton RBF alone (torch GLA) also the median and
    the largest per-parameter error. Not per parameter: the gradients of the 4-entry grid weights are sums over
    ~10^5 cancelling terms and carry a bf16 error of ~0.1 on both paths (measured), which parameter is worst
    is chance. The Triton kernel itself is checked element by element against fp64 in test_rbf_gpu.py.
    """
    model, x, y, (logits_true, grads_true) = setup
    fast = run(copy.deepcopy(model).set_backends(attn=attn_mode, kan="triton"), x, y, torch.bfloat16)
    slow = run(copy.deepcopy(model).set_backends(attn="torch", kan="torch"), x, y, torch.bfloat16)
    (logits_fast, grads_fast), (logits_slow, grads_slow) = fast, slow
    assert torch.isfinite(logits_fast).all()
    errs = {
        "logits": (rel_norm(logits_fast, logits_true), rel_norm(logits_slow, logits_true)),
        "all grads": (rel_norm(flat(grads_fast), flat(grads_true)), rel_norm(flat(grads_slow), flat(grads_true))),
    }
    params = {
        n: (rel_norm(grads_fast[n], g), rel_norm(grads_slow[n], g)) for n, g in grads_true.items() if g.norm() > 0
    }
    fast_params, slow_params = (torch.tensor([e[i] for e in params.values()]) for i in (0, 1))
    errs["median parameter"] = (fast_params.median().item(), slow_params.median().item())
    errs["worst parameter"] = (fast_params.max().item(), slow_params.max().item())
    print(
        f"bf16 attn={attn_mode} kan=triton, rel. error vs fp32 truth (fast / torch-bf16): "
        + "; ".join(f"{k} {a:.2e} / {b:.2e}" for k, (a, b) in errs.items())
    )
    checked = errs if attn_mode == "torch" else {k: errs[k] for k in ("logits", "all grads")}
    for name, (fast_err, slow_err) in checked.items():
        assert fast_err <= 2 * slow_err + 1e-2, name
