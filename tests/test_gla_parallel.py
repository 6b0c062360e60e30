"""The parallel-form GLA kernels under the Triton interpreter against the float64 recurrence.

As for the short kernels (test_gla_short.py, whose inputs these cases share), the cases run once in a child process
with TRITON_INTERPRET=1 unless this process already interprets, and each case's measured errors are asserted here.
The interpreter tiles the other chunks' rows by 32 (the GPU autotunes 32 or 64), so T = 33 and 70 take the partial
and several tiles.
"""

from __future__ import annotations

import pytest
import torch
import triton_interpreter
from test_gla_short import OUTPUTS, TOL, make_inputs, outputs_and_grads
from tolerance import rel_max

from lkat_lens.kernels import gla_parallel
from lkat_lens.kernels.gla import gla_recurrent

# id -> (T, K, V, gate, dtype, layout), as in test_gla_short.CASES
CASES = {
    f"T{T}-K{K}-V{V}-{gate}-{dtype}-{layout}": (T, K, V, gate, dtype, layout)
    for T, K, V, gate, dtype, layout in [
        (1, 16, 16, "mild", "float32", "contiguous"),
        (17, 16, 16, "strong", "float32", "contiguous"),
        (33, 32, 16, "near_one", "float32", "contiguous"),
        (70, 16, 32, "strong", "float32", "contiguous"),
        (70, 16, 16, "extreme", "float32", "contiguous"),
        (70, 32, 32, "mixed", "float32", "contiguous"),
        (201, 64, 64, "mild", "float32", "model"),
        (53, 16, 16, "mild", "bfloat16", "contiguous"),
        (201, 64, 64, "mixed", "bfloat16", "model"),
    ]
}


def _measure_case(case: tuple) -> dict:
    """Errors against the fp64 recurrence, and whether dtypes, shapes and values are right."""
    T, K, V, gate, dtype_name, layout = case
    q, k, v, gk, do = make_inputs(T, K, V, gate, getattr(torch, dtype_name), layout)
    got = outputs_and_grads(gla_parallel.gla_parallel, q, k, v, gk, do)
    ref = outputs_and_grads(lambda *x: gla_recurrent(*(t.double() for t in x))[0], q, k, v, gk, do.double())
    errors = {name: rel_max(g, r) for name, g, r in zip(OUTPUTS, got, ref, strict=True)}
    inputs = (v, q, k, v, gk)
    errors["layout_ok"] = all(g.dtype == x.dtype and g.shape == x.shape for g, x in zip(got, inputs, strict=True))
    errors["finite"] = all(bool(torch.isfinite(g).all()) for g in got)
    return errors


def _check_op_and_compile() -> dict:
    """torch.library.opcheck of both custom ops, and torch.compile(fullgraph=True) through them."""
    q, k, v, gk, do = make_inputs(21, 16, 16, "mild", torch.float32, "model")
    b = gk.cumsum(1)
    torch.library.opcheck(torch.ops.lkat_lens.gla_parallel_backward, (q, k, v, b, do, 0.25))
    q, k, v, b = (x.requires_grad_() for x in (q, k, v, b))
    torch.library.opcheck(torch.ops.lkat_lens.gla_parallel, (q, k, v, b, 0.25))

    def fn(*x):
        return gla_parallel.gla_parallel(*x, scale=0.25) * 2

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    eager = outputs_and_grads(fn, q, k, v, gk, do)
    traced = outputs_and_grads(compiled, q, k, v, gk, do)
    return {"opcheck": True, "compile_err": max(rel_max(a, b) for a, b in zip(traced, eager, strict=True))}


def interpreter_measurements() -> dict:
    """Every case's measurements (needs TRITON_INTERPRET=1 before triton was imported)."""
    results = {cid: _measure_case(case) for cid, case in CASES.items()}
    results["op"] = _check_op_and_compile()
    return results


@pytest.fixture(scope="module")
def interp() -> dict:
    """Interpreter measurements, computed here or in a child process with TRITON_INTERPRET=1."""
    return triton_interpreter.measurements(__file__, gla_parallel.INTERPRET, interpreter_measurements)


@pytest.mark.parametrize("case_id", list(CASES))
def test_interpreter_matches_fp64_recurrence(interp: dict, case_id: str) -> None:
    measured = interp[case_id]
    assert measured["layout_ok"] and measured["finite"], measured
    for name in OUTPUTS:
        assert measured[name] <= TOL[CASES[case_id][4]], (name, measured)


def test_custom_ops_pass_opcheck_and_compile_without_graph_break(interp: dict) -> None:
    assert interp["op"]["opcheck"]
    assert interp["op"]["compile_err"] < 1e-6


def test_input_validation() -> None:
    q, v = torch.zeros(1, 3, 2, 64), torch.zeros(1, 3, 2, 32)
    with pytest.raises(ValueError, match="gla_parallel needs K and V in"):
        gla_parallel.gla_parallel(q, q, torch.zeros(1, 3, 2, 24), q)
    with pytest.raises(ValueError, match="expected q, k, gk"):
        gla_parallel.gla_parallel(q, q[:, :2], v, q)
    with pytest.raises(ValueError, match="gla_parallel needs operands in"):
        gla_parallel.gla_parallel(q.double(), q, v, q)
    if not gla_parallel.INTERPRET:
        with pytest.raises(RuntimeError, match="gla_parallel needs CUDA"):
            gla_parallel.gla_parallel(q, q, v, q)


if __name__ == "__main__":
    triton_interpreter.report(interpreter_measurements)
