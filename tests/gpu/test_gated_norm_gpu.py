"""GLA's fused eager output path (per-head LayerNorm(o) * SiLU(g)) on CUDA against the fp64 reference, and in LKAT-T
against the model's own modules and against the model in fp64."""

from __future__ import annotations

import pytest
import torch
from model_paths import backend_step, compiled_path_errors, errors, fp64_path_errors, lkat_t_and_images
from tolerance import rel_max

from lkat_lens.kernels.gated_norm import gated_norm, gated_norm_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("N", "H", "V"), [(32 * 201, 12, 64), (7, 3, 48)], ids=["lkat_b", "ragged"])
def test_kernel_matches_fp64_reference(N: int, H: int, V: int, dtype: torch.dtype) -> None:
    """Output and the gradients of o, of g (a column slice of a projection output), of the weight and the bias."""
    gen = torch.Generator(device="cuda").manual_seed(N)
    o = (torch.randn(N, H, V, device="cuda", generator=gen) * 2 + 0.5).to(dtype)
    g = torch.randn(N, 3 * H * V, device="cuda", generator=gen)[:, H * V : 2 * H * V].unflatten(-1, (H, V)).to(dtype)
    weight, bias = torch.randn(V, device="cuda", generator=gen) + 1, torch.randn(V, device="cuda", generator=gen)
    dout = torch.randn(N, H, V, device="cuda", generator=gen)

    def run(fn, cast):
        leaves = [t.detach().to(cast or t.dtype).requires_grad_() for t in (o, g, weight, bias)]
        out = fn(*leaves, 1e-5)
        return [out.detach(), *torch.autograd.grad(out, leaves, dout.to(out.dtype))]

    got, ref = run(gated_norm, None), run(gated_norm_reference, torch.float64)
    for name, a, b in zip(("out", "do", "dg", "dweight", "dbias"), got, ref, strict=True):
        assert torch.isfinite(a).all(), name
        assert rel_max(a, b) <= TOL[dtype], (name, rel_max(a, b))


def test_lkat_fused_output_as_close_to_fp64_as_the_modules() -> None:
    """A two-block LKAT-T at 224² in fp32: logits and the flat parameter gradient, the output path fused and with the
    modules, against the model in fp64 (modules); under bf16 autocast the two paths agree to bf16 rounding."""
    model, images = lkat_t_and_images()
    measured = fp64_path_errors(model, images, "gla_output")
    assert measured["torch"] < 1e-3 and measured["fused"] <= 2 * measured["torch"] + 1e-7, measured
    o = torch.zeros(1, 2, 3, 64, device="cuda")
    assert model.set_backends(gla_output="auto").blocks[0].attn.fuses_output(o, o)
    bf16 = {mode: backend_step(model, images, True, gla_output=mode) for mode in ("torch", "fused")}
    assert errors(bf16["fused"], bf16["torch"]) < 3e-2


def test_compiled_lkat_with_the_kernel_as_close_as_with_the_modules() -> None:
    """torch.compile (fullgraph, bf16 autocast) of a one-block LKAT-T with the output path as the kernel's custom ops
    and as inductor's fusion of the modules: logits and the flat parameter gradient as close to the fp32 eager model
    as each other, and the kernel is what the compiled step runs."""
    model, images = lkat_t_and_images(depth=1)
    measured = compiled_path_errors(model, images, "gla_output", "_gated_norm_bwd_kernel")
    assert measured["fused"] <= 1.5 * measured["torch"] + 1e-3, measured
