"""A whole LKAT-T on CUDA: fla GLA + Triton RBF against the exact torch paths, forward and backward."""

import copy

import pytest
import torch

import lkat_lens

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run(model, x, y, dtype):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        logits = model(x)
    torch.nn.functional.cross_entropy(logits.float(), y).backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters()}
    return logits.detach().float(), grads


FP32, BF16 = (torch.float32, 5e-3, 1e-2), (torch.bfloat16, 5e-2, 1e-1)  # dtype, logit and gradient tolerances


# fp32 skips fla's chunk_gla: it faults on fp32 inputs (see kernels/gla.py), so "auto" never picks it there.
CASES = [("fused_recurrent", FP32), ("chunk", BF16), ("fused_recurrent", BF16)]


@pytest.mark.parametrize("attn_mode, precision", CASES)
def test_lkat_tiny_fast_paths_match_torch_paths(attn_mode, precision):
    dtype, logit_tol, grad_tol = precision
    torch.manual_seed(0)
    fast = lkat_lens.create_model("lkat_tiny_patch16_224", num_classes=100).cuda().train()
    for m in fast.modules():  # reference init makes KAN outputs ~0; give them weight so they are tested
        if isinstance(m, lkat_lens.models.KANLayer):
            torch.nn.init.normal_(m.grid_linear.weight, std=0.5)
            torch.nn.init.normal_(m.dim_linear.weight, std=m.in_features**-0.5)
    ref = copy.deepcopy(fast).set_backends(attn="torch", kan="torch")
    fast.set_backends(attn=attn_mode, kan="triton")
    x = torch.randn(4, 3, 224, 224, device="cuda")
    y = torch.randint(0, 100, (4,), device="cuda")
    logits_fast, grads_fast = run(fast, x, y, dtype)
    logits_ref, grads_ref = run(ref, x, y, dtype)
    assert torch.isfinite(logits_fast).all()
    assert rel(logits_fast, logits_ref) < logit_tol
    worst = max(grads_ref, key=lambda n: rel(grads_fast[n], grads_ref[n]) if grads_ref[n].norm() > 0 else 0)
    print(f"{dtype} {attn_mode}: logits rel {rel(logits_fast, logits_ref):.2e}, worst grad {worst} "
          f"rel {rel(grads_fast[worst], grads_ref[worst]):.2e}")
    for name, g in grads_ref.items():
        if g.norm() > 0:
            assert rel(grads_fast[name], g) < grad_tol, name
