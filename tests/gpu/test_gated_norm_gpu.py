"""GLA's fused eager output path (per-head LayerNorm(o) * SiLU(g)) on CUDA against the fp64 reference, and in LKAT-T
against the model's own modules and against the model in fp64."""

from __future__ import annotations

import copy

import pytest
import torch
from tolerance import rel_max, rel_norm

import lkat_lens
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
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_tiny_patch16_224", num_classes=10, depth=2).cuda().set_backends(attn="torch")
    images = torch.randn(4, 3, 224, 224, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))

    def step(net, x, mode, autocast=False):
        net.set_backends(gla_output=mode)
        net.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = net(x).float()
        logits.square().sum().backward()
        grads = torch.cat([p.grad.double().flatten() for p in net.parameters() if p.grad is not None])
        return [logits.detach(), grads]

    def error(results, truth):
        return max(rel_norm(a, b) for a, b in zip(results, truth, strict=True))

    exact = step(copy.deepcopy(model).double(), images.double(), "torch")
    measured = {mode: error(step(model, images, mode), exact) for mode in ("torch", "fused")}
    assert measured["torch"] < 1e-3 and measured["fused"] <= 2 * measured["torch"] + 1e-7, measured
    o = torch.zeros(1, 2, 3, 64, device="cuda")
    assert model.set_backends(gla_output="auto").blocks[0].attn.fuses_output(o, o)
    bf16 = {mode: step(model, images, mode, autocast=True) for mode in ("torch", "fused")}
    assert error(bf16["fused"], bf16["torch"]) < 3e-2


def test_compiled_lkat_with_the_kernel_as_close_as_with_the_modules() -> None:
    """torch.compile (fullgraph, bf16 autocast) of a one-block LKAT-T with the output path as the kernel's custom ops
    and as inductor's fusion of the modules: logits and the flat parameter gradient as close to the fp32 eager model
    as each other, and the kernel is what the compiled step runs."""
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_tiny_patch16_224", num_classes=10, depth=1).cuda()
    images = torch.randn(4, 3, 224, 224, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))

    def step(mode, compiled):
        net = copy.deepcopy(model).set_backends(gla_output=mode)
        run = torch.compile(net, fullgraph=True) if compiled else net
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=compiled):
            logits = run(images).float()
        logits.square().sum().backward()
        return [logits.detach(), torch.cat([p.grad.float().flatten() for p in net.parameters()])]

    truth = step("torch", compiled=False)
    errors = {}
    for mode in ("torch", "fused"):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            results = step(mode, compiled=True)
        errors[mode] = max(rel_norm(a, b) for a, b in zip(results, truth, strict=True))
        names = {e.key for e in prof.key_averages()}
        assert any("_gated_norm_bwd_kernel" in n for n in names) == (mode == "fused"), (mode, sorted(names)[:20])
    torch.compiler.reset()
    assert errors["fused"] <= 1.5 * errors["torch"] + 1e-3, errors
