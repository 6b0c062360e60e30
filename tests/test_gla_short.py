"""The short-sequence GLA kernels under the Triton interpreter against the float64 recurrence.

The kernels run on CPU through the Triton interpreter, which must be switched on (TRITON_INTERPRET=1)
before triton is first imported. Unless this process already runs that way, the cases are computed
once in a child process started with the variable set (this file run as a script), and each case's
measured errors are asserted here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton_interpreter
from tolerance import rel_max

from lkat_lens.kernels import gla_short
from lkat_lens.kernels.gla import gla_recurrent

# log forget gates: logsigmoid(randn) * scale, or the named special pattern ("mixed": batch 0 mild, batch 1 extreme)
GATES = {"mild": 1 / 16, "strong": 2.0, "near_one": 1e-3, "extreme": None, "mixed": None}
# ||out - ref||_max / ||ref||_max for o, dq, dk, dv, dgk: outputs are stored in the input dtype
TOL = {"float32": 1e-5, "bfloat16": 1e-2}
OUTPUTS = ("o", "dq", "dk", "dv", "dgk")
# id -> (T, K, V, gate, dtype, layout); layout "model" is v in the layout of a conv output, as in VisionGLA. T 89
# ends in the 9-row ragged chunk of LKAT's 201 tokens (tests/gpu/test_gla_short_gpu.py runs 201 and longer)
CASES = {
    f"T{T}-K{K}-V{V}-{gate}-{dtype}-{layout}": (T, K, V, gate, dtype, layout)
    for T, K, V, gate, dtype, layout in [
        (1, 16, 16, "mild", "float32", "contiguous"),
        (7, 16, 32, "strong", "float32", "contiguous"),
        (16, 32, 32, "near_one", "float32", "contiguous"),
        (63, 32, 16, "mild", "float32", "contiguous"),
        (65, 64, 64, "strong", "float32", "contiguous"),
        (65, 16, 16, "extreme", "float32", "contiguous"),
        (65, 32, 32, "mixed", "float32", "contiguous"),
        (89, 64, 64, "mild", "float32", "model"),
        (89, 32, 32, "near_one", "float32", "contiguous"),
        (37, 64, 32, "mild", "bfloat16", "contiguous"),
        (89, 64, 64, "mild", "bfloat16", "model"),
        (65, 32, 64, "strong", "bfloat16", "contiguous"),
        (89, 64, 64, "mixed", "bfloat16", "model"),
    ]
}
# id -> (T, K, V, gate, dtype, layout, segment): walks in segments, the states between them passed in parallel
SEGMENTED_CASES = {
    f"T{T}-K{K}-V{V}-{gate}-{dtype}-{layout}-s{seg}": (T, K, V, gate, dtype, layout, seg)
    for T, K, V, gate, dtype, layout, seg in [
        (68, 32, 32, "mild", "float32", "contiguous", 32),  # 3 segments, the last of 4 rows
        (66, 16, 32, "strong", "float32", "model", 64),  # the last segment of 2 rows
        (97, 32, 16, "mixed", "float32", "contiguous", 32),  # direct walks in batch 0, levels in batch 1
        (64, 16, 16, "near_one", "float32", "contiguous", 16),  # segments of one chunk
        (50, 16, 16, "extreme", "float32", "contiguous", 16),
        (86, 32, 32, "mild", "bfloat16", "model", 64),
        (80, 16, 32, "strong", "bfloat16", "contiguous", 32),
    ]
}


def make_inputs(T: int, K: int, V: int, gate: str, dtype: torch.dtype, layout: str, seed: int = 0) -> tuple:
    """q, k, v in dtype, fp32 log gates and an output gradient, [B=2, T, H=2, *]."""
    B, H = 2, 2
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen)
    if gate in ("extreme", "mixed"):
        gk = torch.full((B, T, H, K), -30.0)
        gk[:, ::7] = 0.0
        if gate == "mixed":
            gk[0] = F.logsigmoid(torch.randn(T, H, K, generator=gen)) * GATES["mild"]
    else:
        gk = F.logsigmoid(torch.randn(B, T, H, K, generator=gen)) * GATES[gate]
    do = torch.randn(B, T, H, V, generator=gen)
    if layout == "model":  # [B, T, H, V] viewed from a [B, H * V, T] buffer, t fastest
        v = v.flatten(2).transpose(1, 2).contiguous().transpose(1, 2).unflatten(2, (H, V))
    return q.to(dtype), k.to(dtype), v.to(dtype), gk, do.to(dtype)


def direct_sequences(gk: torch.Tensor) -> torch.Tensor:
    """[B, H]: whether the backward walks (batch, head) by the direct intra-chunk products, the kernel's rule (every
    chunk's |gate cumsum from its start| <= SAFE_LOG), else by the levels."""
    chunk = gla_short.CHUNK.value
    padded = F.pad(gk, (0, 0, 0, 0, 0, (-gk.shape[1]) % chunk))
    return padded.unflatten(1, (-1, chunk)).cumsum(2).abs().amax(dim=(1, 2, 4)) <= gla_short.SAFE_LOG.value


def outputs_and_grads(fn, q, k, v, gk, do) -> list[torch.Tensor]:
    """fn's output and the gradients of sum(o * do) w.r.t. q, k, v, gk."""
    leaves = [x.detach().requires_grad_() for x in (q, k, v, gk)]
    o = fn(*leaves)
    return [o.detach(), *torch.autograd.grad(o, leaves, do)]


def _measure_case(case: tuple, segment: int | None = None) -> dict:
    """Errors of the kernels against the fp64 recurrence, and whether dtypes, shapes and values are right."""
    T, K, V, gate, dtype_name, layout = case
    q, k, v, gk, do = make_inputs(T, K, V, gate, getattr(torch, dtype_name), layout)
    got = outputs_and_grads(lambda *x: gla_short.gla_short(*x, segment=segment), q, k, v, gk, do)
    ref = outputs_and_grads(lambda *x: gla_recurrent(*(t.double() for t in x))[0], q, k, v, gk, do.double())
    errors = {name: rel_max(g, r) for name, g, r in zip(OUTPUTS, got, ref, strict=True)}
    inputs = (v, q, k, v, gk)
    errors["layout_ok"] = all(g.dtype == x.dtype and g.shape == x.shape for g, x in zip(got, inputs, strict=True))
    errors["finite"] = all(bool(torch.isfinite(g).all()) for g in got)
    return errors


def _check_op_and_compile(T: int, segment: int) -> dict:
    """torch.library.opcheck of the custom op, and torch.compile(fullgraph=True) through it."""
    q, k, v, gk, do = make_inputs(T, 16, 16, "mild", torch.float32, "model")
    q, k, v, gk = (x.requires_grad_() for x in (q, k, v, gk))
    torch.library.opcheck(torch.ops.lkat_lens.gla_short, (q, k, v, gk, 0.25, segment))

    def scaled(*x):
        return gla_short.gla_short(*x, scale=0.25, segment=segment) * 2

    compiled = torch.compile(scaled, fullgraph=True, backend="aot_eager")
    eager = outputs_and_grads(scaled, q, k, v, gk, do)
    traced = outputs_and_grads(compiled, q, k, v, gk, do)
    return {"opcheck": True, "compile_err": max(rel_max(a, b) for a, b in zip(traced, eager, strict=True))}


def interpreter_measurements() -> dict:
    """Every case's measurements (needs TRITON_INTERPRET=1 before triton was imported)."""
    results = {cid: _measure_case(case) for cid, case in CASES.items()}
    results |= {cid: _measure_case(case[:6], case[6]) for cid, case in SEGMENTED_CASES.items()}
    results["op"] = _check_op_and_compile(5, 0)
    results["op_segmented"] = _check_op_and_compile(20, 16)
    return results


@pytest.fixture(scope="module")
def interp() -> dict:
    """Interpreter measurements, computed here or in a child process with TRITON_INTERPRET=1."""
    return triton_interpreter.measurements(__file__, gla_short.INTERPRET, interpreter_measurements)


@pytest.mark.parametrize("case_id", [*CASES, *SEGMENTED_CASES])
def test_interpreter_matches_fp64_recurrence(interp: dict, case_id: str) -> None:
    """One walk per sequence (CASES) and walks in segments (SEGMENTED_CASES)."""
    measured, dtype = interp[case_id], {**CASES, **SEGMENTED_CASES}[case_id][4]
    assert measured["layout_ok"] and measured["finite"], measured
    for name in OUTPUTS:
        assert measured[name] <= TOL[dtype], (name, measured)


def test_long_sequences_are_walked_in_segments() -> None:
    assert gla_short.segment_length(gla_short.SEGMENTS_MIN_T - 1) == 0
    assert gla_short.segment_length(4097) == gla_short.SEGMENT
    assert gla_short.SEGMENTS_MIN_T > gla_short.SEGMENT  # a segmented sequence has two segments or more


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cases_take_both_intra_chunk_paths(dtype: str) -> None:
    """The mixed cases check the direct walk (batch 0) and the level walk (batch 1) in one launch."""
    mixed = [case[:6] for case in [*CASES.values(), *SEGMENTED_CASES.values()] if case[3] == "mixed"]
    mixed = [case for case in mixed if case[4] == dtype]
    assert mixed or dtype == "bfloat16"
    for T, K, V, gate, name, layout in mixed:
        direct = direct_sequences(make_inputs(T, K, V, gate, getattr(torch, name), layout)[3])
        assert direct[0].all() and not direct[1].any()


@pytest.mark.parametrize("op", ["op", "op_segmented"])
def test_custom_op_passes_opcheck_and_compiles_without_graph_break(interp: dict, op: str) -> None:
    assert interp[op]["opcheck"]
    assert interp[op]["compile_err"] < 1e-6


def test_products_of_bf16_inputs_take_bf16() -> None:
    """do . v^T multiplies bf16 inputs as bf16 (exact products, the 16-bit tensor cores); mixed, fp16 or fp32
    operands, and the interpreter (whose bf16 tl.dot is wrong), keep the kernels' fp32 precision."""
    bf16, fp16, fp32 = (torch.zeros(1, dtype=d) for d in (torch.bfloat16, torch.float16, torch.float32))
    assert gla_short._input_precision(bf16, bf16) == ("tf32" if gla_short.INTERPRET else "bf16")
    for operands in [(fp16, fp16), (bf16, fp16), (bf16, fp32)]:
        assert gla_short._input_precision(*operands) == "tf32"
    assert gla_short._input_precision(fp32, fp32) == "ieee"


def test_input_validation() -> None:
    q, v = torch.zeros(1, 3, 2, 64), torch.zeros(1, 3, 2, 32)
    assert gla_short.supports(64, 32)
    assert not gla_short.supports(48, 32)
    assert not gla_short.supports(64, 256)
    with pytest.raises(ValueError, match="K and V in"):
        gla_short.gla_short(q, q, torch.zeros(1, 3, 2, 24), q)
    with pytest.raises(ValueError, match="expected q, k, gk"):
        gla_short.gla_short(q, q[:, :2], v, q)
    with pytest.raises(ValueError, match="operands in"):
        gla_short.gla_short(q.double(), q, v, q)
    with pytest.raises(ValueError, match="power of two"):
        gla_short.gla_short(q, q, v, q, segment=48)
    if not gla_short.INTERPRET:
        with pytest.raises(RuntimeError, match="CUDA"):
            gla_short.gla_short(q, q, v, q)


if __name__ == "__main__":
    triton_interpreter.report(interpreter_measurements)
