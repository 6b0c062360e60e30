"""The short-sequence GLA kernels on CUDA against the fp64 recurrence, beside fla's kernels, in LKAT and compiled."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from tolerance import rel_max

import lkat_lens
from lkat_lens.kernels.gla import gated_linear_attention, gla_chunked, gla_recurrent
from lkat_lens.kernels.gla_short import SEGMENT, gla_short

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

NAMES = ("o", "dq", "dk", "dv", "dgk")
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
RECURRENCE_MAX_T = 1024
# LKAT-S at 224^2: 196 patches + 4 registers + 1 class token, 6 heads of 64 (batch cut from 128 for the fp64 reference)
LKAT_S = dict(B=32, T=201, H=6, K=64, V=64)


def make_inputs(B: int, T: int, H: int, K: int, V: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    """q, k, v in dtype, fp32 log gates logsigmoid(randn) / 16 (LKAT's) and an fp32 output gradient."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, device="cuda", generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, device="cuda", generator=gen).to(dtype)
    gk = F.logsigmoid(torch.randn(B, T, H, K, device="cuda", generator=gen)) / 16
    return [q, k, v, gk, torch.randn(B, T, H, V, device="cuda", generator=gen)]


def output_and_grads(fn, q, k, v, gk, do) -> list[torch.Tensor]:
    """fn's output and the gradients of sum(o * do) w.r.t. q, k, v, gk."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, gk)]
    o = fn(*leaves)
    return [o.detach(), *torch.autograd.grad(o, leaves, do.to(o.dtype))]


def reference(q, k, v, gk) -> torch.Tensor:
    """GLA in fp64: the recurrence up to RECURRENCE_MAX_T tokens, beyond it the exact chunked torch form (checked
    against the recurrence in tests/test_gla_ops.py; autograd through thousands of recurrence steps takes minutes)."""
    q, k, v, gk = (t.double() for t in (q, k, v, gk))
    if q.shape[1] <= RECURRENCE_MAX_T:
        return gla_recurrent(q, k, v, gk)[0]
    return gla_chunked(q, k, v, gk, chunk_size=64)[0]


def errors(fn, inputs: list[torch.Tensor]) -> dict[str, tuple[float, float]]:
    """(max-abs / max-ref, Frobenius relative) error of fn's output and gradients against the fp64 `reference`;
    absolute where the reference is exactly zero (dgk of a one-token sequence: its gate multiplies a zero state)."""
    got = output_and_grads(fn, *inputs)
    ref = output_and_grads(reference, *inputs[:4], inputs[4].double())
    out = {}
    for name, g, r in zip(NAMES, got, ref, strict=True):
        assert torch.isfinite(g).all(), name
        scale = r.abs().max().clamp_min(1.0 if r.abs().max() == 0 else 0.0)  # dgk is 0 at T = 1
        out[name] = (rel_max(g, r), ((g.double() - r).norm() / r.norm().clamp_min(scale)).item())
    return out


def mode(name: str):
    """The dispatcher in one mode, as a function of (q, k, v, gk)."""
    return lambda *x: gated_linear_attention(*x, mode=name)


@pytest.mark.parametrize(
    ("dtype", "fla_mode"), [(torch.bfloat16, "chunk"), (torch.float32, "fused_recurrent")], ids=str
)
def test_lkat_s_shape_no_less_exact_than_fla(dtype: torch.dtype, fla_mode: str) -> None:
    """At LKAT-S's shape: within TOL of the fp64 recurrence, and no further from it than fla's kernel
    (chunk_gla in bf16; fused_recurrent_gla in fp32, where fla 0.6.0's chunk_gla faults)."""
    inputs = make_inputs(**LKAT_S, dtype=dtype)
    ours, fla = errors(mode("short"), inputs), errors(mode(fla_mode), inputs)
    print(f"\n{dtype} short vs fp64 {ours}\n{dtype} {fla_mode} vs fp64 {fla}")
    for name in NAMES:
        assert ours[name][0] < TOL[dtype], (name, ours[name])
    if dtype == torch.bfloat16:
        for name in NAMES:
            assert ours[name][1] <= 1.05 * fla[name][1], (name, ours[name], fla[name])


@pytest.mark.parametrize("T", [1, 17, 64, 201, 511, 512, 1024, 4097])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_lengths_match_recurrence(dtype: torch.dtype, T: int) -> None:
    """Every T within TOL of the fp64 recurrence; from SEGMENTS_MIN_T (512) on, walked in segments."""
    result = errors(mode("short"), make_inputs(B=2, T=T, H=4, K=64, V=64, dtype=dtype, seed=T))
    assert all(result[name][0] < TOL[dtype] for name in NAMES), result


@pytest.mark.parametrize("segment", [64, SEGMENT])
def test_segment_lengths_no_less_exact_than_fla_chunk(segment: int) -> None:
    """LKAT-S's heads at 1024^2 (4,097 tokens, the last segment one row): segments of up to SEGMENT tokens within
    TOL of the fp64 recurrence and no further from it than fla's chunk_gla. (Longer walks sum dgk's reverse cumsum
    over more rows: at this shape one walk, 256 and 512 gave dgk Frobenius errors of 5.8e-3, 2.3e-3 and 2.7e-3
    against chunk_gla's 2.2e-3, H200 2026-11-26; gla_short.SEGMENT keeps to 128.)"""
    inputs = make_inputs(B=2, T=4097, H=6, K=64, V=64, dtype=torch.bfloat16, seed=5)
    ours = errors(lambda *x: gla_short(*x, segment=segment), inputs)
    fla = errors(mode("chunk"), inputs)
    print(f"\nsegments of {segment}: {ours}\nchunk: {fla}")
    for name in NAMES:
        assert ours[name][0] < TOL[torch.bfloat16], (name, ours[name])
        assert ours[name][1] <= 1.05 * fla[name][1], (name, ours[name], fla[name])


def test_bf16_gates_no_less_exact_than_fla_chunk() -> None:
    """Log gates in bf16 (as the reference's fla layer forms them under bf16 autocast; LKAT here keeps them in fp32):
    within TOL of the fp64 recurrence of the same gates and no further from it than fla's chunk_gla given them; dgk
    comes back in bf16."""
    T = 201
    inputs = make_inputs(B=2, T=T, H=6, K=64, V=64, dtype=torch.bfloat16, seed=7)
    inputs[3] = inputs[3].to(torch.bfloat16)
    ours, fla = errors(mode("short"), inputs), errors(mode("chunk"), inputs)
    print(f"\nbf16 gates, T {T}: short {ours}\nchunk {fla}")
    for name in NAMES:
        assert ours[name][0] < TOL[torch.bfloat16], (name, ours[name])
        assert ours[name][1] <= 1.05 * fla[name][1], (name, ours[name], fla[name])
    assert output_and_grads(gla_short, *inputs)[4].dtype == torch.bfloat16


@pytest.mark.parametrize("T", [201, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fast_decaying_gates_take_the_level_walk(dtype: torch.dtype, T: int) -> None:
    """Gates that decay by more than SAFE_LOG within a chunk (batch 4 onwards: logsigmoid(randn) * 8, about -100 per
    chunk) send those sequences to the level walk in the launch where batch 0-3 take the direct one: all within
    TOL of the fp64 recurrence, in one walk (201 tokens) and in segments (1,000)."""
    inputs = make_inputs(B=8, T=T, H=6, K=64, V=64, dtype=dtype, seed=3)
    gen = torch.Generator(device="cuda").manual_seed(4)
    inputs[3][4:] = F.logsigmoid(torch.randn(inputs[3][4:].shape, device="cuda", generator=gen)) * 8
    result = errors(mode("short"), inputs)
    assert all(result[name][0] < TOL[dtype] for name in NAMES), result


@pytest.mark.parametrize("T", [201, 1000])
def test_conv_layout_v_gives_identical_results(T: int) -> None:
    """v in a conv output's layout (t fastest, as VisionGLA makes it) changes no bit, in one walk and in segments."""
    q, k, v, gk, do = make_inputs(B=2, T=T, H=6, K=64, V=64, dtype=torch.bfloat16)
    v_conv = v.flatten(2).transpose(1, 2).contiguous().transpose(1, 2).unflatten(2, (6, 64))
    plain = output_and_grads(gla_short, q, k, v, gk, do)
    strided = output_and_grads(gla_short, q, k, v_conv, gk, do)
    assert all(torch.equal(a, b) for a, b in zip(plain, strided, strict=True))


@pytest.mark.parametrize("T", [201, 1000])
def test_compiled_without_graph_break(T: int) -> None:
    """torch.compile(fullgraph=True) with inductor keeps the custom op and gives the eager results."""
    inputs = make_inputs(B=4, T=T, H=6, K=64, V=64, dtype=torch.bfloat16)

    def fn(q, k, v, gk):
        return gla_short(q * 2, k, v, F.logsigmoid(gk) / 16) + 1

    compiled = torch.compile(fn, fullgraph=True)
    eager, traced = output_and_grads(fn, *inputs), output_and_grads(compiled, *inputs)
    for a, b in zip(eager, traced, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


def test_lkat_short_mode_matches_torch_mode() -> None:
    """A small LKAT (head dim 64) on CUDA in fp32, attn="short" and attn="torch", each against the model in fp64:
    logits and every parameter gradient as close as the exact torch GLA's (both carry fp32 rounding)."""
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_micro", num_classes=10, embed_dim=128, num_heads=2).cuda()
    x = torch.randn(8, 3, 16, 16, device="cuda")

    def run(net: torch.nn.Module, attn: str, images: torch.Tensor) -> list[torch.Tensor]:
        net.zero_grad(set_to_none=True)
        logits = net.set_backends(attn=attn)(images)
        logits.square().sum().backward()
        return [logits.detach(), *(p.grad.clone() for p in net.parameters())]

    exact = run(copy.deepcopy(model).double().set_backends(kan="torch", gla_input="torch"), "torch", x.double())
    errors = {}
    for attn in ("short", "torch"):
        errors[attn] = max(
            ((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
            for a, b in zip(run(model, attn, x), exact, strict=True)
        )
    assert errors["torch"] < 1e-3 and errors["short"] <= 2 * errors["torch"] + 1e-6, errors
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model.set_backends(attn="short")(x)
    assert torch.isfinite(logits).all()
