"""GLA's fused eager output path (per-head LayerNorm(o) * SiLU(g), kernels/gated_norm.py) under the Triton
interpreter against float64, and in lkat_micro against its modules.

The kernels run on CPU through the Triton interpreter, in a child process started with TRITON_INTERPRET=1 unless
this process already runs that way (see triton_interpreter.py).
"""

from __future__ import annotations

import pytest
import torch
import triton_interpreter
from tolerance import rel_max

import lkat_lens
from lkat_lens.kernels import gated_norm

OUTPUTS = ("out", "do", "dg", "dweight", "dbias")
TOL = {"float32": 1e-5, "bfloat16": 2e-2}
# id -> (N, H, V, dtype, g as a column slice of a wider tensor)
CASES = {
    f"N{N}-H{H}-V{V}-{dtype}-{'sliced' if sliced else 'contiguous'}": (N, H, V, dtype, sliced)
    for N, H, V, dtype, sliced in [
        (5, 3, 64, "float32", True),  # LKAT's layout: g a slice of the projection output
        (37, 2, 48, "float32", False),  # width not a power of two, ragged row tiles
        (300, 2, 16, "float32", True),  # several backward programs, the last ragged
        (1, 1, 8, "float32", False),
        (90, 3, 64, "bfloat16", True),
    ]
}


def make_case(N: int, H: int, V: int, dtype: torch.dtype, sliced: bool) -> tuple[torch.Tensor, ...]:
    """(o, g, weight, bias, output gradient) with o [N, H, V], g the same shape (a strided slice when `sliced`)."""
    gen = torch.Generator().manual_seed(0)
    o = torch.randn(N, H, V, generator=gen) * 2 + 0.5
    if sliced:
        g = torch.randn(N, 3 * H * V, generator=gen)[:, H * V : 2 * H * V].unflatten(-1, (H, V))
    else:
        g = torch.randn(N, H, V, generator=gen)
    weight, bias = torch.randn(V, generator=gen) + 1.0, torch.randn(V, generator=gen) * 0.1
    return o.to(dtype), g.to(dtype), weight, bias, torch.randn(N, H, V, generator=gen)


def outputs_and_grads(fn, o, g, weight, bias, dout) -> list[torch.Tensor]:
    """fn's output and the gradients of sum(out * dout) w.r.t. o, g, weight and bias."""
    leaves = [t.detach().requires_grad_() for t in (o, g, weight, bias)]
    out = fn(*leaves, 1e-5)
    return [out.detach(), *torch.autograd.grad(out, leaves, dout.to(out.dtype))]


def _measure_case(case: tuple) -> dict:
    N, H, V, dtype_name, sliced = case
    o, g, weight, bias, dout = make_case(N, H, V, getattr(torch, dtype_name), sliced)
    got = outputs_and_grads(gated_norm.gated_norm, o, g, weight, bias, dout)
    ref = outputs_and_grads(
        gated_norm.gated_norm_reference, o.double(), g.double(), weight.double(), bias.double(), dout
    )
    errors = {name: rel_max(a, b) for name, a, b in zip(OUTPUTS, got, ref, strict=True)}
    expected = [(o.dtype, o.shape), (o.dtype, o.shape), (g.dtype, g.shape), (weight.dtype, weight.shape)]
    expected += [(bias.dtype, bias.shape)]
    errors["layout_ok"] = [(t.dtype, t.shape) for t in got] == expected
    with torch.no_grad():  # without gradients the kernel runs alone, no autograd node: the same output
        plain = gated_norm.gated_norm(o, g, weight, bias, 1e-5)
    errors["no_grad_same"] = plain.grad_fn is None and torch.equal(plain, got[0])
    return errors


def _check_op_and_compile() -> dict:
    """torch.library.opcheck of both custom ops (g a strided column slice), and torch.compile (fullgraph) through
    the forward op and its registered backward."""
    o, g, weight, bias, dout = make_case(5, 3, 64, torch.float32, True)
    leaves = [t.requires_grad_() for t in (o, g, weight, bias)]
    torch.library.opcheck(torch.ops.lkat_lens.gated_norm, (*leaves, 1e-5))
    detached = [t.detach() for t in (o, g, weight, bias)]  # the backward op has no gradient of its own
    torch.library.opcheck(torch.ops.lkat_lens.gated_norm_backward, (*detached, dout, 1e-5))

    def fn(*args):
        return gated_norm.gated_norm(*args) * 2

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    eager = outputs_and_grads(fn, o, g, weight, bias, dout)
    traced = outputs_and_grads(compiled, o, g, weight, bias, dout)
    return {"opcheck": True, "compile_err": max(rel_max(a, b) for a, b in zip(traced, eager, strict=True))}


def _check_model() -> dict:
    """lkat_micro's output path fused and as modules against fp64; fuses_output fused, "auto" on the CPU and with a
    hook on g_norm (triton_interpreter.path_in_lkat)."""

    def fuses(attn) -> bool:
        o = torch.zeros(1, 4, attn.num_heads, attn.head_v_dim)
        return attn.fuses_output(o, o)

    return triton_interpreter.path_in_lkat("gla_output", fuses, lambda attn: attn.g_norm)


def _every_row_tile() -> dict:
    """The largest error of any output of one case at each row tile the CUDA autotuner tries: every tile launches
    the same backward programs, so each writes every weight/bias partial the host sums."""
    errors, interp_rows = {}, gated_norm._INTERP_ROWS
    try:
        for rows in (16, 32, 64):
            gated_norm._INTERP_ROWS = rows
            measured = _measure_case((300, 2, 16, "float32", True))
            errors[rows] = max(measured[name] for name in OUTPUTS)
    finally:
        gated_norm._INTERP_ROWS = interp_rows
    return errors


def interpreter_measurements() -> dict:
    """Every case's measurements (needs TRITON_INTERPRET=1 before triton was imported)."""
    results = {cid: _measure_case(case) for cid, case in CASES.items()}
    results["row_tiles"] = _every_row_tile()
    results["op"] = _check_op_and_compile()
    results["model"] = _check_model()
    return results


@pytest.fixture(scope="module")
def interp() -> dict:
    return triton_interpreter.measurements(__file__, gated_norm.INTERPRET, interpreter_measurements)


@pytest.mark.parametrize("case_id", list(CASES))
def test_interpreter_matches_fp64_reference(interp: dict, case_id: str) -> None:
    measured = interp[case_id]
    assert measured["layout_ok"] and measured["no_grad_same"], measured
    for name in OUTPUTS:
        assert measured[name] <= TOL[CASES[case_id][3]], (name, measured)


def test_every_row_tile_gives_the_same_gradients(interp: dict) -> None:
    assert len(interp["row_tiles"]) == 3 and max(interp["row_tiles"].values()) <= TOL["float32"], interp["row_tiles"]


def test_fused_output_matches_the_modules_in_lkat(interp: dict) -> None:
    """lkat_micro's fp32 logits and every parameter's gradient (g_norm's weight and bias among them), fused and with
    the modules, against fp64: both within fp32 rounding through the network (the largest error of either is block
    0's fc2 grid weights, a sum over every element of the layer: 5.8e-5 with the modules, 1.4e-4 fused, others under
    1e-5). "auto" keeps the modules on the CPU; a hook on g_norm turns the kernel off and fires."""
    measured = interp["model"]
    errors = measured["errors"]
    assert measured["grads"] > 50 and errors["torch"] < 1e-3 and errors["fused"] < 1e-3, measured
    assert measured["fuses"] and not measured["fuses_auto_cpu"] and not measured["fuses_hooked"], measured
    assert measured["hook_calls"] == 1, measured  # block 0's g_norm ran once


def test_reference_matches_the_model_modules() -> None:
    """The kernel's torch reference against the model's own g_norm and SiLU, in fp64."""
    attn = lkat_lens.create_model("lkat_micro", num_classes=10).double().blocks[0].attn
    gen = torch.Generator().manual_seed(3)
    o = torch.randn(2, 5, attn.num_heads, attn.head_v_dim, generator=gen, dtype=torch.float64)
    g = torch.randn(o.shape, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        attn.g_norm.weight.normal_(generator=gen)
        expected = attn.g_norm(o) * torch.nn.functional.silu(g)
        got = gated_norm.gated_norm_reference(o, g, attn.g_norm.weight, attn.g_norm.bias, attn.g_norm.eps)
    assert rel_max(got, expected) < 1e-12


def test_input_validation() -> None:
    o = torch.zeros(2, 3, 16)
    with pytest.raises(ValueError, match="on CUDA"):
        gated_norm.gated_norm(o.double(), o.double(), torch.ones(16), torch.zeros(16), 1e-5)
    with pytest.raises(ValueError, match="weight, bias"):
        gated_norm.gated_norm(o, o[:, :2], torch.ones(16), torch.zeros(16), 1e-5)
    with pytest.raises(ValueError, match="gla_output must be one of"):
        lkat_lens.create_model("lkat_micro", num_classes=10).set_backends(gla_output="fast")


def test_custom_ops_pass_opcheck_and_compile_without_graph_break(interp: dict) -> None:
    assert interp["op"]["opcheck"]
    assert interp["op"]["compile_err"] < 1e-6


def test_compiled_graphs_may_pass_any_strides() -> None:
    """Both ops read their tensors through their strides (g comes as a column slice of the projection output), so
    inductor must not copy them to the strides they were traced with."""
    for op in (torch.ops.lkat_lens.gated_norm.default, torch.ops.lkat_lens.gated_norm_backward.default):
        assert torch.Tag.flexible_layout in op.tags, op.tags


if __name__ == "__main__":
    triton_interpreter.report(interpreter_measurements)
