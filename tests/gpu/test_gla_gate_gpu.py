"""GLA's fused forget gate (logsigmoid(code @ W^T + b) / n) on CUDA against the fp64 reference, and in LKAT-T against
the model's own modules and against the model in fp64, eager and compiled."""

from __future__ import annotations

import pytest
import torch
from model_paths import backend_step, compiled_path_errors, errors, fp64_path_errors, lkat_t_and_images
from tolerance import rel_max

from lkat_lens.kernels.gla_gate import gla_gate, gla_gate_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("N", "R", "K", "scale"),
    [(32 * 201, 16, 768, 1.0), (7, 16, 48, 1.0), (301, 8, 200, 1.0), (256, 16, 192, 40.0)],
    ids=["lkat_b", "ragged", "rank8", "large_logits"],
)
def test_kernel_matches_fp64_reference(N: int, R: int, K: int, scale: float, dtype: torch.dtype) -> None:
    """The gate and the gradients of the code (a column slice of a projection output), the weight and the bias."""
    gen = torch.Generator(device="cuda").manual_seed(N)
    code = torch.randn(N, 3 * R + K, device="cuda", generator=gen)[:, R : 2 * R].mul(scale).to(dtype)
    weight = torch.randn(K, R, device="cuda", generator=gen) * R**-0.5
    bias, dgk = torch.randn(K, device="cuda", generator=gen), torch.randn(N, K, device="cuda", generator=gen)

    def run(fn, cast):
        leaves = [t.detach().to(cast or t.dtype).requires_grad_() for t in (code, weight, bias)]
        gk = fn(*leaves, 16.0)
        return [gk.detach(), *torch.autograd.grad(gk, leaves, dgk.to(gk.dtype))]

    got, ref = run(gla_gate, None), run(gla_gate_reference, torch.float64)
    for name, a, b in zip(("gk", "dcode", "dweight", "dbias"), got, ref, strict=True):
        assert torch.isfinite(a).all(), name
        assert rel_max(a, b) <= TOL[dtype], (name, rel_max(a, b))


def test_lkat_fused_gate_as_close_to_fp64_as_the_modules() -> None:
    """A two-block LKAT-T at 224² in fp32: logits and the flat parameter gradient, the gate fused and as modules,
    against the model in fp64 (modules); under bf16 autocast the two paths agree to bf16 rounding."""
    model, images = lkat_t_and_images()
    measured = fp64_path_errors(model, images, "gla_gate")
    assert measured["torch"] < 1e-3 and measured["fused"] <= 2 * measured["torch"] + 1e-7, measured
    assert model.set_backends(gla_gate="auto").blocks[0].attn.fuses_gate(torch.zeros(1, 2, 16, device="cuda"))
    bf16 = {mode: backend_step(model, images, True, gla_gate=mode) for mode in ("torch", "fused")}
    assert errors(bf16["fused"], bf16["torch"]) < 3e-2


def test_compiled_lkat_with_the_kernel_as_close_as_with_the_modules() -> None:
    """torch.compile (fullgraph, bf16 autocast) of a one-block LKAT-T with the gate as the kernel's custom ops and as
    inductor's fusion of the modules: as close to the fp32 eager model as each other, and the kernel ran."""
    model, images = lkat_t_and_images(depth=1)
    measured = compiled_path_errors(model, images, "gla_gate", "_gla_gate_bwd_kernel")
    assert measured["fused"] <= 1.5 * measured["torch"] + 1e-3, measured
