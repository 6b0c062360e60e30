"""GLA's fused input-path kernel on CUDA against the fp64 reference, and in LKAT-T (eager and compiled) against the
model's own modules and against the model in fp64."""

from __future__ import annotations

import pytest
import torch
from model_paths import backend_step, errors, fp64_path_errors, lkat_t_and_images
from test_gla_input import QKV_OUTPUTS, make_qkv_case, qkv_reference, run_qkv_kernels
from tolerance import rel_max

from lkat_lens.kernels.gla_input import gla_input, gla_input_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("B", "T", "H", "DH", "rope"),
    [(32, 197, 3, 64, True), (32, 201, 6, 64, True), (8, 5, 2, 48, True), (16, 1029, 6, 64, False)],
    ids=["lkat_t", "lkat_s", "ragged", "long_v"],
)
def test_kernel_matches_fp64_reference(B: int, T: int, H: int, DH: int, rope: bool, dtype: torch.dtype) -> None:
    """Output and the gradients of x (a column slice of a projection output), the conv and the norm weights."""
    gen = torch.Generator(device="cuda").manual_seed(T)
    D = H * DH
    x = torch.randn(B, T, 3 * D, device="cuda", generator=gen)[..., D : 2 * D].to(dtype)
    weight = torch.randn(D, 1, 4, device="cuda", generator=gen) * 0.5
    norm_weight = torch.randn(DH, device="cuda", generator=gen) + 1.0 if rope else None
    angles = torch.randn(T, DH // 2, device="cuda", generator=gen)
    cos, sin = (angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)) if rope else (None,) * 2
    do = torch.randn(B, T, H, DH, device="cuda", generator=gen)

    def run(fn, cast):
        leaves = [t.detach().to(cast or t.dtype).requires_grad_() for t in (x, weight, norm_weight) if t is not None]
        tables = [t if t is None or cast is None else t.to(cast) for t in (cos, sin)]
        out = fn(*leaves, *([] if rope else [None]), *tables, heads=H, eps=1e-6)
        return [out.detach(), *torch.autograd.grad(out, leaves, do.to(out.dtype))]

    got = run(gla_input, None)
    ref = run(gla_input_reference, torch.float64)
    for name, g, r in zip(("out", "dx", "d_conv", "d_norm"), got, ref, strict=False):
        assert torch.isfinite(g).all(), name
        assert rel_max(g, r) <= TOL[dtype], (name, rel_max(g, r))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("B", "T", "H", "K", "V"),
    [(32, 197, 3, 64, 64), (32, 201, 6, 64, 64), (8, 5, 2, 48, 48), (4, 1029, 6, 64, 32)],
    ids=["lkat_t", "lkat_s", "ragged", "long_v_wider"],
)
def test_qkv_kernels_match_fp64_reference(B: int, T: int, H: int, K: int, V: int, dtype: torch.dtype) -> None:
    """q, k and v of one stacked projection output (one launch each way, two where v's heads differ) and their
    gradients against the fp64 reference of each; dx's other columns untouched."""
    y, convs, norms, cos, sin, grads = (
        tuple(t.cuda() for t in x) if isinstance(x, tuple) else x.cuda() for x in make_qkv_case(B, T, H, K, V, dtype, 4)
    )
    grads = tuple(g.to(dtype) for g in grads)
    got, untouched = run_qkv_kernels(y, convs, norms, cos, sin, grads, H)
    ref = qkv_reference(y, convs, norms, cos, sin, grads, H)
    assert untouched
    for name, g, r in zip(QKV_OUTPUTS, got, ref, strict=True):
        assert torch.isfinite(g).all(), name
        assert rel_max(g, r) <= TOL[dtype], (name, rel_max(g, r))


@pytest.fixture(scope="module")
def lkat_t():
    """A two-block LKAT-T at 224² with the exact torch GLA, and a batch of images."""
    return lkat_t_and_images()


def step(model: torch.nn.Module, images: torch.Tensor, mode: str, autocast: bool = False) -> list[torch.Tensor]:
    """Logits and the flat parameter gradient of one backward of the logits' squares, GLA inputs in `mode`."""
    return backend_step(model, images, autocast, gla_input=mode)


def test_lkat_fused_inputs_as_close_to_fp64_as_the_modules(lkat_t) -> None:
    """fp32 logits and gradients (conv and norm weights among them) against the model in fp64 (modules)."""
    model, images = lkat_t
    measured = fp64_path_errors(model, images, "gla_input")
    assert measured["torch"] < 1e-3 and measured["fused"] <= 2 * measured["torch"] + 1e-7, measured
    assert model.blocks[0].attn.fuses_inputs(torch.zeros(1, 2, 192, device="cuda"))


def test_lkat_fused_inputs_in_bf16_eager_and_compiled(lkat_t) -> None:
    """Under bf16 autocast the fused path is as close to the fp32 model as the modules are; compiled with fullgraph
    (the op breaks no graph) it is as close as eager."""
    model, images = lkat_t
    truth = step(model, images, "torch")
    measured = {mode: errors(step(model, images, mode, True), truth) for mode in ("torch", "fused")}
    measured["compiled"] = errors(step(torch.compile(model, fullgraph=True), images, "fused", True), truth)
    torch.compiler.reset()
    assert measured["fused"] <= 1.5 * measured["torch"] + 1e-3, measured
    assert measured["compiled"] <= 2 * measured["fused"] + 1e-2, measured
