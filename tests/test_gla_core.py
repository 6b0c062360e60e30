"""GLA's core as one op (kernels/gla_core.py: input paths, forget gate, short GLA and output path, its backward
writing every piece's gradient into one matrix) under the Triton interpreter against the float64 composition of the
pieces' torch references, and in lkat_micro against the pieces and the modules.

The kernels run on CPU through the Triton interpreter, in a child process started with TRITON_INTERPRET=1 unless
this process already runs that way (see triton_interpreter.py).
"""

from __future__ import annotations

import copy

import pytest
import torch
import triton_interpreter
from tolerance import rel_max

import lkat_lens
from lkat_lens.kernels import gla_core
from lkat_lens.kernels.gated_norm import gated_norm_reference
from lkat_lens.kernels.gla import gla_recurrent
from lkat_lens.kernels.gla_gate import gla_gate_reference
from lkat_lens.kernels.gla_input import gla_input_reference

GRADS = ("dy", "dconv_q", "dconv_k", "dconv_v", "dnorm_q", "dnorm_k", "dgate_w", "dgate_b", "dout_w", "dout_b")
TOL = {"float32": 1e-5, "bfloat16": 3e-2}
HANDOFF_FACTOR = 1.5
EPS = (1e-6, 1e-5, 1e-5)  # q_norm's, k_norm's, g_norm's
NORMALIZER = 16.0
# id -> (T, H, K (head), V (head), R, dtype, segment, y a column slice of a wider tensor)
CASES = {
    f"T{T}-H{H}-K{K}-V{V}-R{R}-{dtype}-s{seg}{'-sliced' if sliced else ''}": (T, H, K, V, R, dtype, seg, sliced)
    for T, H, K, V, R, dtype, seg, sliced in [
        (21, 2, 16, 32, 16, "float32", 0, False),  # one walk, a ragged chunk, V != K
        (40, 2, 32, 32, 8, "float32", 16, True),  # in segments, the last ragged; rank < 16; y strided; K = V
        (21, 1, 16, 16, 16, "bfloat16", 0, False),  # LKAT's training dtype
    ]
}


def make_case(
    T: int, H: int, K: int, V: int, R: int, dtype: torch.dtype, sliced: bool, batch: int = 2, device: str = "cpu"
) -> tuple[list, torch.Tensor]:
    """([y, the 11 weights and tables as gla_core takes them, flat], z's gradient) on `device`: y [batch, T, P] in
    dtype, the rest fp32 (y a column slice of a wider tensor when `sliced`)."""
    gen = torch.Generator().manual_seed(0)
    kd, vd = H * K, H * V
    width = 2 * kd + 2 * vd + R
    y = torch.randn(batch, T, width + (5 if sliced else 0), generator=gen)[..., :width].to(dtype)
    convs = [torch.randn(d, 1, 4, generator=gen) * 0.5 for d in (kd, kd, vd)]
    norms = [1 + 0.1 * torch.randn(K, generator=gen) for _ in range(2)]
    angles = torch.randn(T, K // 2, generator=gen).repeat_interleave(2, -1)
    gate = [torch.randn(kd, R, generator=gen) * R**-0.5, torch.randn(kd, generator=gen)]
    out_norm = [1 + 0.1 * torch.randn(V, generator=gen), 0.1 * torch.randn(V, generator=gen)]
    flat = [y, *convs, *norms, angles.cos(), angles.sin(), *gate, *out_norm]
    return [t.to(device) for t in flat], torch.randn(batch, T, H, V, generator=gen).to(device)


def scale_of(flat: list, heads: int) -> float:
    """The query scale LKAT gives heads of make_case's key width: head_dim^-1/2."""
    return (flat[1].shape[0] // heads) ** -0.5


def core_of(flat: list, heads: int, segment: int) -> torch.Tensor:
    """gla_core of make_case's flat operands."""
    y, cq, ck, cv, nq, nk, cos, sin, gw, gb, ow, ob = flat
    return gla_core.gla_core(y, (cq, ck, cv), (nq, nk), (cos, sin), (gw, gb), (ow, ob), heads=heads,
                             scale=scale_of(flat, heads), segment=segment, eps=EPS, normalizer=NORMALIZER)  # fmt: skip


def reference_of(flat: list, heads: int, segment: int, handoff: torch.dtype | None = None) -> torch.Tensor:
    """The same from the pieces' torch references and the plain GLA recurrence (segment plays no part); with
    `handoff`, q, k, v and the GLA output rounded to that dtype where the pieces hand them on."""
    y, cq, ck, cv, nq, nk, cos, sin, gw, gb, ow, ob = flat
    kd, vd = cq.shape[0], cv.shape[0]
    yq, yk, yv, yg, code = y.split([kd, kd, vd, vd, y.shape[-1] - 2 * (kd + vd)], dim=-1)

    def handed_on(t: torch.Tensor) -> torch.Tensor:
        return t if handoff is None else t.to(handoff).to(t.dtype)

    q = handed_on(gla_input_reference(yq, cq, nq, cos, sin, heads, EPS[0]))
    k = handed_on(gla_input_reference(yk, ck, nk, cos, sin, heads, EPS[1]))
    v = handed_on(gla_input_reference(yv, cv, None, None, None, heads, 0.0))
    gk = gla_gate_reference(code, gw, gb, NORMALIZER).unflatten(-1, (heads, -1))
    o = handed_on(gla_recurrent(q, k, v, gk, scale=scale_of(flat, heads))[0])
    return gated_norm_reference(o, yg.unflatten(-1, (heads, -1)), ow, ob, EPS[2])


def handoff_errors(flat: list, dz: torch.Tensor, heads: int, ref: list[torch.Tensor]) -> dict[str, float]:
    """The errors against the fp64 `ref` of fp32 arithmetic with the pieces' hand-offs (q, k, v, the GLA output)
    rounded to y's dtype: what storing them in that dtype alone costs. In bf16 some operands make it large (at
    LKAT-T's heads, T = 201, make_case's draw puts dy 0.14 off through the hand-offs alone)."""
    fp32 = [t.float() for t in flat]
    got = outputs_and_grads(lambda *a: reference_of(*a, handoff=flat[0].dtype), fp32, dz.float(), heads, 0)
    return {name: rel_max(a, b) for name, a, b in zip(("z", *GRADS), got, ref, strict=True)}


def bound(dtype: str, handoff_error: float) -> float:
    """The core's allowed error against fp64: TOL, or within 1.5× of what the hand-offs alone cost."""
    return max(TOL[dtype], HANDOFF_FACTOR * handoff_error)


def leaves_of(flat: list) -> list[torch.Tensor]:
    """make_case's operands as leaves, all but the rotary tables (flat[6:8]) requiring gradients."""
    return [t.detach().requires_grad_(i not in (6, 7)) for i, t in enumerate(flat)]


def outputs_and_grads(fn, flat: list, dz: torch.Tensor, heads: int, segment: int) -> list[torch.Tensor]:
    """fn's z and the gradients of sum(z * dz) w.r.t. y and every weight (not the rotary tables)."""
    leaves = leaves_of(flat)
    z = fn(leaves, heads, segment)
    grads = torch.autograd.grad(z, [t for t in leaves if t.requires_grad], dz.to(z.dtype))
    return [z.detach(), *grads]


def _measure_case(case: tuple) -> dict:
    T, H, K, V, R, dtype_name, segment, sliced = case
    flat, dz = make_case(T, H, K, V, R, getattr(torch, dtype_name), sliced)
    got = outputs_and_grads(core_of, flat, dz, H, segment)
    ref = outputs_and_grads(reference_of, [t.double() for t in flat], dz.double(), H, segment)
    errors = {name: rel_max(a, b) for name, a, b in zip(("z", *GRADS), got, ref, strict=True)}
    errors["handoff"] = handoff_errors(flat, dz, H, ref)
    shapes = [tuple(t.shape) for t in flat if t is not flat[6] and t is not flat[7]]
    errors["layout_ok"] = [tuple(t.shape) for t in got[1:]] == shapes and got[1].dtype == flat[0].dtype
    errors["finite"] = all(bool(torch.isfinite(t).all()) for t in got)
    with torch.no_grad():  # without gradients the kernels run alone, no autograd node: the same output
        plain = core_of(flat, H, segment)
    errors["no_grad_same"] = plain.grad_fn is None and torch.equal(plain, got[0])
    return errors


def _check_model() -> dict:
    """lkat_micro (two blocks) in fp32 with the short GLA and every path fused, its core as one op and as the pieces
    (the same kernels), each against the model in fp64 with the modules; whether block 0 takes the core with "fused",
    with "auto" (the CPU: no), with a hook on hook_q (no, and the hook fires) and with the GLA in mode "torch" (no)."""
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_micro", num_classes=10, depth=2)
    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    exact = triton_interpreter.logits_and_grads(copy.deepcopy(model).double(), images.double(), attn="torch")
    model.set_backends(attn="short", gla_input="fused", gla_output="fused", gla_gate="fused")
    results = {mode: triton_interpreter.logits_and_grads(model, images, gla_core=mode) for mode in ("torch", "fused")}
    measured = {
        "grads": len(exact) - 1,
        "errors": {mode: max(rel_max(a, b) for a, b in zip(got, exact, strict=True)) for mode, got in results.items()},
        "core_vs_pieces": max(rel_max(a, b) for a, b in zip(results["fused"], results["torch"], strict=True)),
    }
    attn = model.blocks[0].attn
    y = torch.zeros(1, 17, attn.q_proj.out_features * 4 + attn.gk_proj[0].out_features)
    measured["fuses"] = attn.fuses_core(y)
    measured["fuses_auto_cpu"] = model.set_backends(gla_core="auto").blocks[0].attn.fuses_core(y)
    model.set_backends(gla_core="fused")
    calls = []
    handle = attn.hook_q.register_forward_hook(lambda *_: calls.append(1))
    measured["fuses_hooked"] = attn.fuses_core(y)
    model(images)
    handle.remove()
    measured["hook_calls"] = len(calls)
    measured["fuses_unhooked_again"] = attn.fuses_core(y)
    attn.gk_proj[1].to(torch.float16)  # the gate kernel takes fp32 weights only
    measured["fuses_half_gate"] = attn.fuses_core(y)
    attn.gk_proj[1].float()
    measured["fuses_other_dtype"] = attn.fuses_core(y.double())
    measured["fuses_gla_torch"] = model.set_backends(attn="torch").blocks[0].attn.fuses_core(y)
    return measured


def interpreter_measurements() -> dict:
    """Every case's measurements (needs TRITON_INTERPRET=1 before triton was imported)."""
    results = {cid: _measure_case(case) for cid, case in CASES.items()}
    results["model"] = _check_model()
    return results


@pytest.fixture(scope="module")
def interp() -> dict:
    return triton_interpreter.measurements(__file__, gla_core.INTERPRET, interpreter_measurements)


@pytest.mark.parametrize("case_id", list(CASES))
def test_interpreter_matches_fp64_pieces(interp: dict, case_id: str) -> None:
    """z and the gradients of y (every piece's columns written by its own kernel) and of every weight against the
    fp64 composition of the pieces' references."""
    measured = interp[case_id]
    assert measured["layout_ok"] and measured["finite"] and measured["no_grad_same"], measured
    for name in ("z", *GRADS):
        assert measured[name] <= bound(CASES[case_id][5], measured["handoff"][name]), (name, measured)


def test_core_matches_the_pieces_and_modules_in_lkat(interp: dict) -> None:
    """lkat_micro's logits and every parameter's gradient: the core as one op equals the pieces' kernels up to fp32
    rounding, and both are within fp32 rounding of the fp64 modules through the network."""
    measured = interp["model"]
    errors = measured["errors"]
    assert measured["grads"] > 25 and errors["torch"] < 1e-3 and errors["fused"] < 1e-3, measured
    assert measured["core_vs_pieces"] < 1e-5, measured


def test_core_runs_only_where_nothing_needs_the_pieces(interp: dict) -> None:
    """ "fused" takes the core; "auto" on the CPU, a hook on hook_q, fp16 gate weights, an fp64 projection output and
    the GLA in torch mode do not (the hook fires once, in block 0); fuses_core remembers its answers, but not past a
    change to any of those (the core again once the hook is gone)."""
    measured = interp["model"]
    assert measured["fuses"] and not measured["fuses_auto_cpu"], measured
    assert not measured["fuses_hooked"] and measured["hook_calls"] == 1, measured
    assert measured["fuses_unhooked_again"], measured
    assert not measured["fuses_half_gate"] and not measured["fuses_other_dtype"], measured
    assert not measured["fuses_gla_torch"], measured


def test_input_validation() -> None:
    flat, _ = make_case(5, 1, 16, 16, 8, torch.float32, False)
    with pytest.raises(ValueError, match=r"y \[B, T, 2 K \+ 2 V \+ R\] = \[B, T, 72\]"):
        core_of([flat[0][..., :-1], *flat[1:]], 1, 0)
    with pytest.raises(ValueError, match="gla_core must be one of"):
        lkat_lens.create_model("lkat_micro", num_classes=10).set_backends(gla_core="fast")


if __name__ == "__main__":
    triton_interpreter.report(interpreter_measurements)
