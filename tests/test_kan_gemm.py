"""The fused RBF-KAN layer (basis inside the matmul): torch paths, and the Triton kernels under the interpreter.

As in test_rbf_kernel.py, the interpreter cases run once in a child process started with
TRITON_INTERPRET=1 (this file run as a script) unless this process already runs that way; each case's
measured errors are asserted here.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
import triton_interpreter

from lkat_lens.kernels import kan_triton
from lkat_lens.kernels.kan_linear import edge_kan_linear, edge_linear_reference, kan_linear, kan_linear_reference
from lkat_lens.kernels.rbf import rbf_basis, rbf_grid_linear

GRID = (-2.0, 2.0)
# (leading dims of x, in features K, out features N): ragged against the interpreter's 16-wide tiles.
SHAPES = [((37,), 23, 19), ((2, 9), 40, 33), ((1,), 5, 3), ((70,), 17, 50)]
# ||out - ref|| / ||ref|| against float64; half outputs are rounded once, grid-weight grads accumulate in fp32.
TOL = {
    "float32": {"y": 1e-5, "dx": 1e-5, "dW": 1e-5, "dgw": 1e-5},
    "bfloat16": {"y": 1e-2, "dx": 1e-2, "dW": 1e-2, "dgw": 1e-4},
}


def _cases() -> dict[str, tuple[str, str, int, tuple]]:
    """Interpreter cases by id: (form, dtype, G, shape)."""
    cases = {}
    combos = itertools.product(["shared", "channel", "edge"], [2, 4, 8, 16], ["float32", "bfloat16"])
    for i, (form, G, dtype) in enumerate(combos):
        shape = SHAPES[i % len(SHAPES)]
        cases[f"{form}-{dtype}-G{G}-{shape}"] = (form, dtype, G, shape)
    return cases


CASES = _cases()


def _operands(form: str, dtype: torch.dtype, G: int, shape: tuple, seed: int) -> tuple[torch.Tensor, ...]:
    """x (spilling past the grid), grid weights (shared as [G] or [1, G]), W and an upstream gradient."""
    (lead, K, N), gen = shape, torch.Generator().manual_seed(seed)
    x = (1.5 * torch.randn(*lead, K, generator=gen)).to(dtype)
    gw_shape = (K, G) if form == "channel" else (G,) if seed % 2 else (1, G)
    gw = torch.randn(gw_shape, generator=gen)
    W = (torch.randn(N, K * G if form == "edge" else K, generator=gen) / K**0.5).to(dtype)
    dy = torch.randn(*lead, N, generator=gen).to(dtype)
    return x, gw, W, dy


def _layer(form: str, x: torch.Tensor, gw: torch.Tensor, W: torch.Tensor, backend: str) -> torch.Tensor:
    """The layer on one backend (the reference when backend is None)."""
    if form == "edge":
        G = W.shape[1] // x.shape[-1]
        if backend is None:
            return edge_linear_reference(x, W, *GRID, G)
        return edge_kan_linear(x, W, *GRID, G, backend=backend)
    return kan_linear_reference(x, gw, W, *GRID) if backend is None else kan_linear(x, gw, W, *GRID, backend=backend)


def _fwd_bwd(form: str, operands: tuple, backend: str | None, dtype: torch.dtype | None = None) -> dict:
    """y and the gradients of x, W and the grid weights (operands cast to dtype first when given)."""
    x, gw, W, dy = (t if dtype is None else t.to(dtype) for t in operands)
    leaves = [t.clone().requires_grad_() for t in (x, gw, W)]
    y = _layer(form, *leaves, backend)
    y.backward(dy)
    out = {"y": y.detach(), "dx": leaves[0].grad, "dW": leaves[2].grad}
    if form != "edge":
        out["dgw"] = leaves[1].grad
    return out


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64."""
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _measure_case(index: int, case: tuple) -> dict:
    """Errors of the fused op against the float64 reference, and whether output/grad dtypes are right."""
    form, dtype_name, G, shape = case
    dtype = getattr(torch, dtype_name)
    operands = _operands(form, dtype, G, shape, seed=index)
    fused = _fwd_bwd(form, operands, "fused")
    ref = _fwd_bwd(form, operands, None, torch.float64)
    result = {k: _rel(fused[k], ref[k]) for k in fused}
    result["layout_ok"] = fused["y"].dtype == fused["dx"].dtype == fused["dW"].dtype == dtype and (
        form == "edge" or fused["dgw"].shape == operands[1].shape
    )
    return result


def _measure_saved_and_partial_grads() -> dict:
    """Saved tensors are the inputs themselves; grads only where asked; zero rows work."""
    x, gw, W, dy = _operands("channel", torch.float32, 4, SHAPES[0], seed=0)
    xt, gwt, Wt = x.clone().requires_grad_(), gw.clone().requires_grad_(), W.clone().requires_grad_()
    saved_kan = kan_linear(xt, gwt, Wt, *GRID, backend="fused").grad_fn.saved_tensors
    We = torch.randn(5, x.shape[-1] * 4, requires_grad=True)
    saved_edge = edge_kan_linear(xt, We, *GRID, 4, backend="fused").grad_fn.saved_tensors
    only_w = kan_linear(x, gwt, Wt, *GRID, backend="fused")
    only_w.backward(dy)
    ref = _fwd_bwd("channel", (x, gw, W, dy), None, torch.float64)
    # the backward kernel without dx (nothing but W needs a gradient), and without psi (W frozen), shared grid weights
    shared = _operands("shared", torch.float32, 4, SHAPES[0], seed=1)
    shared_ref = _fwd_bwd("shared", shared, None, torch.float64)
    W_alone = shared[2].clone().requires_grad_()
    kan_linear(shared[0], shared[1], W_alone, *GRID, backend="fused").backward(shared[3])
    x_alone = shared[0].clone().requires_grad_()
    kan_linear(x_alone, shared[1], shared[2], *GRID, backend="fused").backward(shared[3])
    empty = torch.zeros(0, x.shape[-1], requires_grad=True)
    y0 = kan_linear(empty, gwt, Wt, *GRID, backend="fused")
    y0.sum().backward()
    return {
        "saved_kan": [t is s for t, s in zip((xt, gwt, Wt), saved_kan, strict=True)],
        "saved_edge": [t is s for t, s in zip((xt, We), saved_edge, strict=True)],
        "only_w_dW": _rel(Wt.grad, ref["dW"]),
        "only_w_dgw": _rel(gwt.grad, ref["dgw"]),
        "W_alone_dW": _rel(W_alone.grad, shared_ref["dW"]),
        "x_alone_dx": _rel(x_alone.grad, shared_ref["dx"]),
        "empty_ok": y0.shape == (0, W.shape[0]) and empty.grad.shape == empty.shape,
    }


def _measure_autocast() -> dict:
    """Under CPU bf16 autocast: fp32 x, output in bf16, dx in fp32, close to the fp64 reference."""
    x, gw, W, dy = _operands("shared", torch.float32, 8, SHAPES[1], seed=3)
    results, gen = {}, torch.Generator().manual_seed(4)
    for form in ("shared", "edge"):
        Wf = W if form == "shared" else torch.randn(W.shape[0], W.shape[1] * 8, generator=gen) / W.shape[1] ** 0.5
        xt, gwt, Wt = x.clone().requires_grad_(), gw.clone().requires_grad_(), Wf.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = _layer(form, xt, gwt, Wt, "fused")
        y.backward(dy.bfloat16())
        ref = _fwd_bwd(form, (x, gw, Wf.bfloat16().float(), dy.bfloat16()), None, torch.float64)
        results[form] = {
            "dtypes": [str(t.dtype) for t in (y, xt.grad, Wt.grad)],
            "y": _rel(y, ref["y"]),
            "dx": _rel(xt.grad, ref["dx"]),
        }
    return results


def interpreter_measurements() -> dict:
    """Every interpreter measurement (needs TRITON_INTERPRET=1 before triton was imported)."""
    results = {cid: _measure_case(i, case) for i, (cid, case) in enumerate(CASES.items())}
    results["saved"] = _measure_saved_and_partial_grads()
    results["autocast"] = _measure_autocast()
    return results


@pytest.fixture(scope="module")
def interp() -> dict:
    """Interpreter measurements, computed here or in a child process with TRITON_INTERPRET=1."""
    return triton_interpreter.measurements(__file__, kan_triton.INTERPRET, interpreter_measurements)


@pytest.mark.parametrize("case_id", list(CASES))
def test_fused_interpreter_matches_fp64(interp: dict, case_id: str) -> None:
    measured = interp[case_id]
    assert measured["layout_ok"], measured
    for key, tol in TOL[CASES[case_id][1]].items():
        if key in measured:
            assert measured[key] <= tol, (key, measured)


def test_fused_saves_only_inputs_and_grads_where_asked(interp: dict) -> None:
    measured = interp["saved"]
    assert all(measured["saved_kan"]) and all(measured["saved_edge"]), measured
    assert measured["only_w_dW"] <= 1e-5 and measured["only_w_dgw"] <= 1e-5, measured
    assert measured["W_alone_dW"] <= 1e-5 and measured["x_alone_dx"] <= 1e-5, measured
    assert measured["empty_ok"]


@pytest.mark.parametrize("form", ["shared", "edge"])
def test_fused_follows_autocast(interp: dict, form: str) -> None:
    measured = interp["autocast"][form]
    assert measured["dtypes"] == ["torch.bfloat16", "torch.float32", "torch.float32"], measured
    assert measured["y"] <= 1e-2 and measured["dx"] <= 1e-2, measured


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_cpu_paths_are_the_unfused_layer(backend: str) -> None:
    x, gw, W, dy = _operands("channel", torch.float32, 4, SHAPES[1], seed=5)
    expected = F.linear(rbf_grid_linear(x, gw, *GRID, backend="torch"), W)
    assert torch.equal(kan_linear(x, gw, W, *GRID, backend=backend), expected)
    We = torch.randn(7, x.shape[-1] * 4)
    expected_edge = F.linear(rbf_basis(x, *GRID, 4).flatten(-2), We)
    assert torch.equal(edge_kan_linear(x, We, *GRID, 4, backend=backend), expected_edge)


def test_references_gradcheck() -> None:
    gen = torch.Generator().manual_seed(6)
    x = (1.5 * torch.randn(3, 4, generator=gen, dtype=torch.float64)).requires_grad_()
    gw = torch.randn(4, 5, generator=gen, dtype=torch.float64).requires_grad_()
    W = torch.randn(2, 4, generator=gen, dtype=torch.float64).requires_grad_()
    We = torch.randn(2, 20, generator=gen, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b, c: kan_linear(a, b, c, *GRID, backend="torch"), (x, gw, W))
    assert torch.autograd.gradcheck(lambda a, b: edge_kan_linear(a, b, *GRID, 5, backend="torch"), (x, We))


def test_input_validation() -> None:
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="unknown backend"):
        kan_linear(x, torch.randn(1, 4), torch.randn(2, 4), *GRID, backend="cuda")
    with pytest.raises(ValueError, match="fused backend"):
        kan_linear(x.double(), torch.randn(1, 4), torch.randn(2, 4).double(), *GRID, backend="fused")
    with pytest.raises(ValueError, match="weight must be"):
        edge_kan_linear(x, torch.randn(2, 12), *GRID, 4)


if __name__ == "__main__":
    triton_interpreter.report(interpreter_measurements)
