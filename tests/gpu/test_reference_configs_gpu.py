"""The reference-config options (issue 20) on CUDA: fla / gla_short GLA and the Triton KAN kernels against the
exact torch paths, forward and backward in fp32, for every option that changes the computation.

tests/test_reference_configs.py proves the torch paths equal an independent reference-form computation on the
CPU; here the fast paths must equal the torch paths on the GPU.
"""

import copy

import pytest
import torch
from model_paths import give_kan_weight, run, worst_grad
from test_reference_configs import KATT_CASES, LKAT_CASES
from tolerance import rel_norm

import lkat_lens

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SMALL = dict(img_size=32, patch_size=4, embed_dim=128, depth=2, num_heads=2, num_classes=10)  # 64 patches, head 64
# Cases of the CPU test (tests/test_reference_configs.py) whose options are LKAT keywords as they stand.
LKAT_OPTION_CASES = (
    "default",
    "rope_2dv0",
    "rope_theta",
    "no_cls_token",
    "no_abs_pos",
    "registers_1",
    "registers_7",
    "no_short_conv",
    "conv_size_2",
    "expand_k_half",
    "expand_v_2",
    "everything",
)
LKAT_OPTIONS = {case: LKAT_CASES[case] for case in LKAT_OPTION_CASES}
RBFKAT_OPTIONS = {
    "rope_2dv0": KATT_CASES["rope_2dv0"],
    "no_cls_no_abs_pos": {"use_cls_token": False, "use_abs_pos": False},
}
CASES = [("lkat_tiny_patch16_224", k, v) for k, v in LKAT_OPTIONS.items()]
CASES += [("rbfkat_tiny_patch16_224", k, v) for k, v in RBFKAT_OPTIONS.items()]


@pytest.mark.parametrize(("name", "case", "options"), CASES, ids=[f"{n.split('_')[0]}-{c}" for n, c, _ in CASES])
@pytest.mark.parametrize(("attn", "kan"), [("fused_recurrent", "triton"), ("short", "fused"), ("auto", "auto")])
def test_fast_paths_equal_torch_paths_fp32(name, case, options, attn, kan):
    torch.manual_seed(0)
    model = give_kan_weight(lkat_lens.create_model(name, **SMALL, **options).cuda().eval())
    x = torch.randn(4, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (4,), device="cuda")
    logits_ref, grads_ref = run(copy.deepcopy(model).set_backends(attn="torch", kan="torch"), x, y)
    logits, grads = run(copy.deepcopy(model).set_backends(attn=attn, kan=kan), x, y)
    assert grads.keys() == grads_ref.keys()
    assert rel_norm(logits, logits_ref) < 2e-5, case
    worst, worst_rel = worst_grad(grads, grads_ref)
    print(
        f"{name} {case} {attn}/{kan}: logits rel {rel_norm(logits, logits_ref):.2e}, worst grad {worst} {worst_rel:.2e}"
    )
    assert worst_rel < 2e-4, worst
