"""GLA's fused forget gate (logsigmoid(code @ W^T + b) / n from the low-rank code, kernels/gla_gate.py) under the
Triton interpreter against float64, and in lkat_micro against its modules.

The kernels run on CPU through the Triton interpreter, in a child process started with TRITON_INTERPRET=1 unless
this process already runs that way (see triton_interpreter.py).
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
import triton_interpreter
from tolerance import rel_max

import lkat_lens
from lkat_lens.kernels import gla_gate

OUTPUTS = ("gk", "dcode", "dweight", "dbias")
TOL = {"float32": 1e-5, "bfloat16": 2e-2}
NORMALIZER = 16.0
# id -> (N, R, K, dtype, code as a column slice of a wider tensor, scale of the code)
CASES = {
    f"N{N}-R{R}-K{K}-{dtype}-{'sliced' if sliced else 'contiguous'}-x{scale:g}": (N, R, K, dtype, sliced, scale)
    for N, R, K, dtype, sliced, scale in [
        (37, 16, 64, "float32", True, 1.0),  # LKAT's layout: the code a slice of the projection output
        (300, 16, 48, "float32", True, 1.0),  # three backward programs, the last ragged; K not a multiple of the tile
        (5, 8, 20, "float32", False, 1.0),  # a rank below tl.dot's 16 and a ragged column tile
        (33, 15, 40, "float32", True, 1.0),  # a rank one short of its tile
        (1, 16, 16, "float32", False, 1.0),
        (130, 16, 96, "bfloat16", True, 1.0),
        (64, 16, 32, "float32", True, 40.0),  # logits in the hundreds: log-sigmoid and its slope at both tails
    ]
}


def make_case(N: int, R: int, K: int, dtype: torch.dtype, sliced: bool, scale: float) -> tuple[torch.Tensor, ...]:
    """(code, weight, bias, gate gradient) with code [N, R] (a strided column slice when `sliced`)."""
    gen = torch.Generator().manual_seed(0)
    if sliced:
        code = torch.randn(N, 3 * R + K, generator=gen)[:, R : 2 * R]
    else:
        code = torch.randn(N, R, generator=gen)
    weight, bias = torch.randn(K, R, generator=gen) * R**-0.5, torch.randn(K, generator=gen)
    return (code * scale).to(dtype), weight, bias, torch.randn(N, K, generator=gen)


def outputs_and_grads(fn, code, weight, bias, dgk) -> list[torch.Tensor]:
    """fn's gate and the gradients of sum(gk * dgk) w.r.t. the code, the weight and the bias."""
    leaves = [t.detach().requires_grad_() for t in (code, weight, bias)]
    gk = fn(*leaves, NORMALIZER)
    return [gk.detach(), *torch.autograd.grad(gk, leaves, dgk.to(gk.dtype))]


def _measure_case(case: tuple) -> dict:
    N, R, K, dtype_name, sliced, scale = case
    code, weight, bias, dgk = make_case(N, R, K, getattr(torch, dtype_name), sliced, scale)
    got = outputs_and_grads(gla_gate.gla_gate, code, weight, bias, dgk)
    ref = outputs_and_grads(gla_gate.gla_gate_reference, code.double(), weight.double(), bias.double(), dgk)
    errors = {name: rel_max(a, b) for name, a, b in zip(OUTPUTS, got, ref, strict=True)}
    expected = [(torch.float32, (N, K)), (code.dtype, (N, R)), (weight.dtype, (K, R)), (bias.dtype, (K,))]
    errors["layout_ok"] = [(t.dtype, tuple(t.shape)) for t in got] == expected and got[0].is_contiguous()
    errors["finite"] = all(bool(torch.isfinite(t).all()) for t in got)
    with torch.no_grad():  # without gradients the kernel runs alone, no autograd node: the same output
        plain = gla_gate.gla_gate(code, weight, bias, NORMALIZER)
    errors["no_grad_same"] = plain.grad_fn is None and torch.equal(plain, got[0])
    return errors


def _check_op_and_compile() -> dict:
    """torch.library.opcheck of both custom ops (the code a strided column slice), and torch.compile (fullgraph)
    through the forward op and its registered backward."""
    code, weight, bias, dgk = make_case(37, 16, 64, torch.float32, True, 1.0)
    leaves = [t.requires_grad_() for t in (code, weight, bias)]
    torch.library.opcheck(torch.ops.lkat_lens.gla_gate, (*leaves, NORMALIZER))
    detached = [t.detach() for t in (code, weight, bias)]  # the backward op has no gradient of its own
    torch.library.opcheck(torch.ops.lkat_lens.gla_gate_backward, (*detached, dgk, NORMALIZER))

    def fn(*args):
        return gla_gate.gla_gate(*args) * 2

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    eager = outputs_and_grads(fn, code, weight, bias, dgk)
    traced = outputs_and_grads(compiled, code, weight, bias, dgk)
    return {"opcheck": True, "compile_err": max(rel_max(a, b) for a, b in zip(traced, eager, strict=True))}


def _check_model() -> dict:
    """lkat_micro's gate fused and as modules against fp64; fuses_gate fused, "auto" on the CPU and with a hook on
    gk_proj[1] (triton_interpreter.path_in_lkat)."""

    def fuses(attn) -> bool:
        return attn.fuses_gate(torch.zeros(1, 4, attn.gk_proj[1].in_features))

    return triton_interpreter.path_in_lkat("gla_gate", fuses, lambda attn: attn.gk_proj[1])


def _every_column_tile() -> dict:
    """The largest error of any output of one case at each column tile the CUDA autotuners try."""
    errors, tiles = {}, dict(gla_gate._INTERP_TILES)
    try:
        for bk in (32, 64, 128):
            gla_gate._INTERP_TILES["BK"] = bk
            measured = _measure_case((300, 16, 96, "float32", True, 1.0))
            errors[bk] = max(measured[name] for name in OUTPUTS)
    finally:
        gla_gate._INTERP_TILES.update(tiles)
    return errors


@triton.jit
def _tf32_high_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, gla_gate._tf32_high(tl.load(x_ptr + i, mask=i < n)), mask=i < n)


def _tf32_split() -> dict:
    """_tf32_high of fp32 values over 80 binades (zeros, both signs): its low 13 mantissa bits, and the low part."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen) * torch.exp2(torch.randint(-40, 40, (4096,), generator=gen).float())
    x[:2] = torch.tensor([0.0, -0.0])
    high = torch.empty_like(x)
    _tf32_high_kernel[(triton.cdiv(x.numel(), 1024),)](x, high, x.numel(), BLOCK=1024)
    low = x - high  # exact in fp32 if high is x with its mantissa cut
    return {
        "low_bits_zero": bool((high.view(torch.int32) & 0x1FFF == 0).all()),
        "sum_exact": bool((high.double() + low.double() == x.double()).all()),
        "low_over_x": (low.abs() / x.abs().clamp_min(1e-38)).max().item(),
    }


def interpreter_measurements() -> dict:
    """Every case's measurements (needs TRITON_INTERPRET=1 before triton was imported)."""
    results = {cid: _measure_case(case) for cid, case in CASES.items()}
    results["column_tiles"] = _every_column_tile()
    results["tf32_split"] = _tf32_split()
    results["op"] = _check_op_and_compile()
    results["model"] = _check_model()
    return results


@pytest.fixture(scope="module")
def interp() -> dict:
    return triton_interpreter.measurements(__file__, gla_gate.INTERPRET, interpreter_measurements)


@pytest.mark.parametrize("case_id", list(CASES))
def test_interpreter_matches_fp64_reference(interp: dict, case_id: str) -> None:
    measured = interp[case_id]
    assert measured["layout_ok"] and measured["finite"] and measured["no_grad_same"], measured
    for name in OUTPUTS:
        assert measured[name] <= TOL[CASES[case_id][3]], (name, measured)


def test_every_column_tile_gives_the_same_gradients(interp: dict) -> None:
    tiles = interp["column_tiles"]
    assert len(tiles) == 3 and max(tiles.values()) <= TOL["float32"], tiles


def test_tf32_high_part_leaves_an_exact_low_part(interp: dict) -> None:
    """The two-product route for 16-bit codes (gla_gate._code_dot) splits an operand into a TF32 high part and an fp32
    low part that sum back to it exactly, the low part below 2^-10 of the value."""
    split = interp["tf32_split"]
    assert split["low_bits_zero"] and split["sum_exact"] and split["low_over_x"] < 2**-10, split


def test_fused_gate_matches_the_modules_in_lkat(interp: dict) -> None:
    """lkat_micro's fp32 logits and every parameter's gradient (gk_proj's among them), fused and with the modules,
    against fp64: both within fp32 rounding through the network. "auto" keeps the modules on the CPU; a hook on
    gk_proj[1] turns the kernel off and fires."""
    measured = interp["model"]
    errors = measured["errors"]
    assert measured["grads"] > 50 and errors["torch"] < 1e-3 and errors["fused"] < 1e-3, measured
    assert measured["fuses"] and not measured["fuses_auto_cpu"] and not measured["fuses_hooked"], measured
    assert measured["hook_calls"] == 1, measured  # block 0's gk_proj[1] ran once


def test_reference_matches_the_model_modules() -> None:
    """The kernel's torch reference against the model's own gate (gk_proj[1] and log_gate), in fp64."""
    attn = lkat_lens.create_model("lkat_micro", num_classes=10).double().blocks[0].attn
    second = attn.gk_proj[1]
    code = torch.randn(2, 5, second.in_features, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with torch.no_grad():
        expected = attn.forget_gate(code)
        got = gla_gate.gla_gate_reference(code, second.weight, second.bias, attn.gate_logit_normalizer)
    assert not attn.fuses_gate(code) and rel_max(got, expected) < 1e-12


def test_input_validation() -> None:
    code = torch.zeros(2, 3, 16)
    with pytest.raises(ValueError, match="on CUDA"):
        gla_gate.gla_gate(code.double(), torch.ones(8, 16), torch.zeros(8), NORMALIZER)
    with pytest.raises(ValueError, match=r"weight \[K, R\]"):
        gla_gate.gla_gate(code, torch.ones(8, 12), torch.zeros(8), NORMALIZER)
    with pytest.raises(ValueError, match="gla_gate must be one of"):
        lkat_lens.create_model("lkat_micro", num_classes=10).set_backends(gla_gate="fast")


def test_custom_ops_pass_opcheck_and_compile_without_graph_break(interp: dict) -> None:
    assert interp["op"]["opcheck"]
    assert interp["op"]["compile_err"] < 1e-6


def test_compiled_graphs_may_pass_any_strides() -> None:
    """Both ops read the code through its strides (a column slice of the projection output), so inductor must not
    copy it to the strides it was traced with."""
    for op in (torch.ops.lkat_lens.gla_gate.default, torch.ops.lkat_lens.gla_gate_backward.default):
        assert torch.Tag.flexible_layout in op.tags, op.tags


if __name__ == "__main__":
    triton_interpreter.report(interpreter_measurements)
