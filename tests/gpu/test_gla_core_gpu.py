"""GLA's core as one op (kernels/gla_core.py) on CUDA against the fp64 composition of the pieces' references, and in
LKAT-T against the pieces (the same kernels one op each) eager and compiled."""

from __future__ import annotations

import copy

import pytest
import torch
from model_paths import backend_step, errors, lkat_t_and_images
from tolerance import rel_max

from lkat_lens.kernels import gla_core
from lkat_lens.kernels.gated_norm import gated_norm_reference
from lkat_lens.kernels.gla import gla_recurrent
from lkat_lens.kernels.gla_gate import gla_gate_reference
from lkat_lens.kernels.gla_input import gla_input_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}
EPS = (1e-6, 1e-6, 1e-5)
NAMES = ("z", "dy", "dconv_q", "dconv_k", "dconv_v", "dnorm_q", "dnorm_k", "dgate_w", "dgate_b", "dout_w", "dout_b")


def _operands(B: int, T: int, H: int, K: int, R: int, dtype: torch.dtype) -> tuple[list, torch.Tensor]:
    """y [B, T, P] in dtype and the fp32 weights and tables gla_core takes, flat; z's gradient."""
    gen = torch.Generator(device="cuda").manual_seed(T)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    width = H * K
    y = randn(B, T, 4 * width + R).to(dtype)
    convs = [randn(width, 1, 4) * 0.5 for _ in range(3)]
    norms = [1 + 0.1 * randn(K) for _ in range(2)]
    angles = randn(T, K // 2).repeat_interleave(2, -1)
    gate, out_norm = [randn(width, R) * R**-0.5, randn(width)], [1 + 0.1 * randn(K), 0.1 * randn(K)]
    return [y, *convs, *norms, angles.cos(), angles.sin(), *gate, *out_norm], randn(B, T, H, K)


def _core(flat, heads, segment):
    y, cq, ck, cv, nq, nk, cos, sin, gw, gb, ow, ob = flat
    return gla_core.gla_core(y, (cq, ck, cv), (nq, nk), (cos, sin), (gw, gb), (ow, ob), heads=heads,
                             scale=0.125, segment=segment, eps=EPS, normalizer=16.0)  # fmt: skip


def _reference(flat, heads, segment):
    y, cq, ck, cv, nq, nk, cos, sin, gw, gb, ow, ob = flat
    width = cq.shape[0]
    yq, yk, yv, yg, code = y.split([width] * 4 + [y.shape[-1] - 4 * width], dim=-1)
    q = gla_input_reference(yq, cq, nq, cos, sin, heads, EPS[0])
    k = gla_input_reference(yk, ck, nk, cos, sin, heads, EPS[1])
    v = gla_input_reference(yv, cv, None, None, None, heads, 0.0)
    gk = gla_gate_reference(code, gw, gb, 16.0).unflatten(-1, (heads, -1))
    o = gla_recurrent(q, k, v, gk, scale=0.125)[0]
    return gated_norm_reference(o, yg.unflatten(-1, (heads, -1)), ow, ob, EPS[2])


def _outputs_and_grads(fn, flat, dz, heads, segment):
    leaves = [t.detach().requires_grad_(i not in (6, 7)) for i, t in enumerate(flat)]
    z = fn(leaves, heads, segment)
    return [z.detach(), *torch.autograd.grad(z, [t for t in leaves if t.requires_grad], dz.to(z.dtype))]


@pytest.mark.parametrize(
    ("B", "T", "H", "segment", "dtype"),
    [(8, 201, 3, 0, torch.bfloat16), (8, 201, 3, 0, torch.float32), (2, 600, 2, 128, torch.float32)],
    ids=["lkat_t_bf16", "lkat_t_fp32", "segmented_fp32"],
)
def test_core_matches_fp64_pieces(B: int, T: int, H: int, segment: int, dtype: torch.dtype) -> None:
    """z and the gradients of y and of every weight, at LKAT-T's heads (64 wide) and in segments, against the fp64
    composition of the pieces' references and the plain recurrence."""
    flat, dz = _operands(B, T, H, 64, 16, dtype)
    got = _outputs_and_grads(_core, flat, dz, H, segment)
    ref = _outputs_and_grads(_reference, [t.double() for t in flat], dz.double(), H, segment)
    for name, a, b in zip(NAMES, got, ref, strict=True):
        assert torch.isfinite(a).all(), name
        assert rel_max(a, b) <= TOL[dtype], (name, rel_max(a, b))


def test_lkat_core_equals_the_pieces() -> None:
    """A two-block LKAT-T at 224² with the short GLA: the core as one op gives the pieces' logits and gradients (the
    same kernels) in fp32 and under bf16 autocast; "auto" takes the core on CUDA under autocast."""
    model, images = lkat_t_and_images()
    for autocast in (False, True):
        attn = "auto" if autocast else "short"  # auto takes fla's fused_recurrent for fp32
        got = {mode: backend_step(model, images, autocast, attn=attn, gla_core=mode) for mode in ("torch", "fused")}
        assert errors(got["fused"], got["torch"]) < 1e-6, autocast
    y = torch.zeros(1, 201, 4 * 192 + 16, device="cuda", dtype=torch.bfloat16)
    assert model.set_backends(attn="auto", gla_core="auto").blocks[0].attn.fuses_core(y)
    assert not model.blocks[0].attn.fuses_core(y.float())  # fp32: fla's fused_recurrent, not the short kernels


def test_compiled_lkat_takes_the_core_and_matches_the_pieces(monkeypatch) -> None:
    """torch.compile (fullgraph, bf16 autocast) of a one-block LKAT-T with the core as one op and as the pieces: the
    same closeness to the fp32 eager model, and the core's forward and backward ran exactly when asked for."""
    model, images = lkat_t_and_images(depth=1)
    calls = []
    for name in ("gla_core_fwd", "gla_core_bwd"):
        function = getattr(gla_core, name)
        monkeypatch.setattr(gla_core, name, lambda *a, _f=function, _n=name: calls.append(_n) or _f(*a))
    truth = backend_step(copy.deepcopy(model), images, attn="auto", gla_core="torch")
    measured = {}
    for mode in ("torch", "fused"):
        calls.clear()
        compiled = torch.compile(copy.deepcopy(model).set_backends(attn="auto", gla_core=mode), fullgraph=True)
        measured[mode] = errors(backend_step(compiled, images, autocast=True), truth)
        assert sorted(calls) == ([] if mode == "torch" else ["gla_core_bwd", "gla_core_fwd"]), (mode, calls)
    torch.compiler.reset()
    assert measured["fused"] <= 1.01 * measured["torch"] + 1e-6, measured
