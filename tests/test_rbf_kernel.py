"""The RBF grid-linear operator: torch reference, autograd op and the Triton kernels under the interpreter.

The Triton kernels run on CPU through the Triton interpreter, which must be switched on
(TRITON_INTERPRET=1) before triton is first imported. Unless this process already runs that way,
the interpreter cases are computed once in a child process started with the variable set (this file
run as a script), and each case's measured errors are asserted here.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
import triton_interpreter
from tolerance import assert_close, rel_max

from lkat_lens.kernels import rbf_triton
from lkat_lens.kernels.kan_linear import kan_linear
from lkat_lens.kernels.rbf import backward_and_output, rbf_basis, rbf_grid_linear, rbf_grid_linear_reference

GRIDS = [(-2.0, 2.0), (-1.0, 1.0)]
# x shapes: N*D = 1, 7, 1000 and odd last dims 3, 37, 130 (the channel form's D)
SHAPES = [(1,), (7,), (1000,), (5, 3), (27, 37), (2, 4, 130)]
# ||out - ref|| / ||ref|| against float64: y and dx in the input dtype, dw accumulated in fp32
TOL = {"float32": {"y": 1e-5, "dx": 1e-5, "dw": 1e-5}, "bfloat16": {"y": 1e-2, "dx": 1e-2, "dw": 1e-4}}
HUGE = [3e38, 1e30, 1e4, 30.0, 5.0, 0.3, 0.0]


def _cases() -> dict[str, tuple[str, str, int, tuple[float, float], tuple[int, ...]]]:
    """Interpreter cases by id: (form, dtype, G, grid, x shape)."""
    cases = {}
    combos = itertools.product(["shared", "channel"], [2, 4, 8, 16], GRIDS)
    for i, (form, G, grid) in enumerate(combos):
        dtype = "float32" if i % 2 == 0 else "bfloat16"
        shape = SHAPES[i % len(SHAPES)]
        cases[f"{form}-{dtype}-G{G}-{grid}-{shape}"] = (form, dtype, G, grid, shape)
    for shape, dtype in itertools.product(SHAPES, ["float32", "bfloat16"]):
        cases[f"channel-{dtype}-G8-{GRIDS[0]}-{shape}"] = ("channel", dtype, 8, GRIDS[0], shape)
    return cases


CASES = _cases()


def _weight(form: str, D: int, G: int, gen: torch.Generator, shared_1d: bool) -> torch.Tensor:
    """Shared [G] / [1, G] or channel [D, G] grid weights."""
    if form == "channel":
        return torch.randn(D, G, generator=gen)
    return torch.randn(G, generator=gen) if shared_1d else torch.randn(1, G, generator=gen)


def _fp64_fwd_bwd(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, grid: tuple[float, float]) -> tuple:
    """(y, dx, dw) of the float64 reference by autograd."""
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    y = rbf_grid_linear_reference(xr, wr, *grid)
    y.backward(dy.double())
    return y.detach(), xr.grad, wr.grad


def _triton_fwd_bwd(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, grid: tuple[float, float]) -> tuple:
    """(y, dx, dw) of the autograd op on the Triton backend."""
    xt, wt = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = rbf_grid_linear(xt, wt, *grid, backend="triton")
    y.backward(dy)
    return y.detach(), xt.grad, wt.grad


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64."""
    return ((out.double() - ref).norm() / ref.norm()).item()


def _case_operands(index: int, case: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype]:
    """(x ~ 1.5 N(0, 1), grid weights, upstream gradient, x's dtype) of an interpreter case."""
    form, dtype_name, G, _, shape = case
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(index)
    x = (1.5 * torch.randn(shape, generator=gen)).to(dtype)
    dy = torch.randn(shape, generator=gen).to(dtype)
    return x, _weight(form, shape[-1], G, gen, shared_1d=index % 2 == 1), dy, dtype


def _measure_case(index: int, case: tuple) -> dict:
    """Relative errors of the Triton op against float64, and whether dtypes and shapes are right."""
    x, w, dy, dtype = _case_operands(index, case)
    grid = case[3]
    y, dx, dw = _triton_fwd_bwd(x, w, dy, grid)
    ref = _fp64_fwd_bwd(x, w, dy, grid)
    layout_ok = y.dtype == dx.dtype == dtype and dw.dtype == w.dtype and dw.shape == w.shape == ref[2].shape
    return {"y": _rel(y, ref[0]), "dx": _rel(dx, ref[1]), "dw": _rel(dw, ref[2]), "layout_ok": layout_ok}


def _measure_huge(dtype_name: str, G: int) -> dict:
    """Max errors relative to the largest reference value, for inputs far outside the grid."""
    dtype = getattr(torch, dtype_name)
    x = torch.tensor(HUGE + [-v for v in HUGE]).to(dtype).repeat(3, 1)
    w = torch.randn(x.shape[1], G, generator=torch.Generator().manual_seed(G))
    out = _triton_fwd_bwd(x, w, torch.ones_like(x), (-1.0, 1.0))
    ref = _fp64_fwd_bwd(x, w, torch.ones_like(x), (-1.0, 1.0))
    errors = {
        k: ((o.double() - r).abs().max() / r.abs().max()).item()
        for k, o, r in zip(("y", "dx", "dw"), out, ref, strict=True)
    }
    errors["finite"] = all(bool(torch.isfinite(o).all()) for o in out)
    return errors


def _measure_with_output(index: int, case: tuple) -> dict:
    """The backward that also writes the forward's output (in x's dtype and in bf16): whether its y equals the
    forward kernel's and its dx, dw the plain backward's, exactly (the same products in the same order)."""
    x, w, dy, dtype = _case_operands(index, case)
    grid = case[3]
    _, dx, dw = _triton_fwd_bwd(x, w, dy, grid)
    equal = {}
    for out_dtype in (dtype, torch.bfloat16):
        got_dx, got_dw, y = backward_and_output(x, w, dy, *grid, True, out_dtype)
        forward = rbf_grid_linear(x, w, *grid, backend="triton", out_dtype=out_dtype)
        equal[str(out_dtype)] = [torch.equal(y, forward), torch.equal(got_dx, dx), torch.equal(got_dw, dw)]
    return equal


def _measure_kan_triton_path() -> dict:
    """The KAN layer's "triton" path (psi formed again by the backward kernel, not saved) against the form it replaced,
    F.linear after the Triton RBF op: the largest relative error of y, dx, the grid weights' and W's gradients, for
    shared and channel grid weights."""
    gen = torch.Generator().manual_seed(5)
    x, W, dy = torch.randn(9, 37, generator=gen), torch.randn(11, 37, generator=gen), torch.randn(9, 11, generator=gen)
    errors = {}
    for form, gw in (("shared", torch.randn(1, 4, generator=gen)), ("channel", torch.randn(37, 4, generator=gen))):
        runs = []
        for fn in (
            lambda *t: kan_linear(*t, *GRIDS[0], backend="triton"),
            lambda xx, g, w: F.linear(rbf_grid_linear(xx, g, *GRIDS[0], backend="triton"), w),
        ):
            leaves = [t.clone().requires_grad_() for t in (x, gw, W)]
            y = fn(*leaves)
            runs.append([y.detach(), *torch.autograd.grad(y, leaves, dy)])
        errors[form] = max(rel_max(a, b) for a, b in zip(*runs, strict=True))
    return errors


def interpreter_measurements() -> dict:
    """Every interpreter case's measurements (needs TRITON_INTERPRET=1 before triton was imported)."""
    results = {cid: _measure_case(i, case) for i, (cid, case) in enumerate(CASES.items())}
    results["with_output"] = {cid: _measure_with_output(i, case) for i, (cid, case) in enumerate(CASES.items())}
    results["kan_triton_path"] = _measure_kan_triton_path()
    for dtype_name, G in itertools.product(["float32", "bfloat16"], [4, 16]):
        results[f"huge-{dtype_name}-G{G}"] = _measure_huge(dtype_name, G)
    return results


@pytest.fixture(scope="module")
def interp() -> dict:
    """Interpreter measurements, computed here or in a child process with TRITON_INTERPRET=1."""
    return triton_interpreter.measurements(__file__, rbf_triton.INTERPRET, interpreter_measurements)


@pytest.mark.parametrize("case_id", list(CASES))
def test_triton_interpreter_matches_fp64(interp: dict, case_id: str) -> None:
    measured = interp[case_id]
    assert measured["layout_ok"]
    for key, tol in TOL[CASES[case_id][1]].items():
        assert measured[key] <= tol, (key, measured)


def test_kan_triton_path_equals_the_op_and_linear(interp: dict) -> None:
    assert max(interp["kan_triton_path"].values()) < 1e-6, interp["kan_triton_path"]


def test_backward_writes_the_forwards_output_exactly(interp: dict) -> None:
    """For every case: y (in x's dtype and in bf16), dx and dw of the backward that also writes y equal the forward
    kernel's y and the plain backward's gradients bit for bit."""
    assert interp["with_output"].keys() == CASES.keys()
    unequal = {cid: flags for cid, flags in interp["with_output"].items() if not all(sum(flags.values(), []))}
    assert not unequal, unequal


@pytest.mark.parametrize("G", [4, 16])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_triton_interpreter_far_outside_grid(interp: dict, dtype_name: str, G: int) -> None:
    measured = interp[f"huge-{dtype_name}-G{G}"]
    assert measured["finite"], measured
    tol = 1e-5 if dtype_name == "float32" else 1e-2
    assert max(measured[k] for k in ("y", "dx", "dw")) <= tol, measured


def test_rbf_basis_matches_formula() -> None:
    x = torch.linspace(-3, 3, 61, dtype=torch.float64).reshape(61, 1)
    centers = torch.tensor([-2.0, -2 / 3, 2 / 3, 2.0], dtype=torch.float64)
    expected = torch.exp(-(((x - centers) / (4 / 3)) ** 2))
    basis = rbf_basis(x.squeeze(1), -2.0, 2.0, 4)
    assert basis.shape == (61, 4) and basis.dtype == torch.float64
    assert_close(basis, expected, rtol=1e-14, atol=0)
    xb = x.squeeze(1).bfloat16()
    half = rbf_basis(xb, -2.0, 2.0, 4)
    assert half.dtype == torch.bfloat16
    assert_close(half.double(), rbf_basis(xb.double(), -2.0, 2.0, 4), rtol=4e-3, atol=0)


@pytest.mark.parametrize("weight_shape", [(5,), (1, 5), (7, 5)], ids=["shared-1d", "shared-2d", "channel"])
def test_reference_matches_explicit_sum(weight_shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(0)
    x = 2 * torch.randn(3, 4, 7, generator=gen, dtype=torch.float64)
    w = torch.randn(weight_shape, generator=gen, dtype=torch.float64)
    w2 = w.reshape(-1, 5)
    h = 2.0 / 4
    expected = sum(w2[:, g] * torch.exp(-(((x - (-1.0 + g * h)) / h) ** 2)) for g in range(5))
    assert_close(rbf_grid_linear_reference(x, w, -1.0, 1.0), expected, rtol=1e-13, atol=1e-15)
    y32 = rbf_grid_linear_reference(x.float(), w.float(), -1.0, 1.0)
    assert y32.dtype == torch.float32
    assert_close(y32.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["shared", "channel"])
def test_reference_and_torch_op_gradcheck(form: str) -> None:
    gen = torch.Generator().manual_seed(1)
    x = (1.5 * torch.randn(4, 6, generator=gen, dtype=torch.float64)).requires_grad_()
    w = torch.randn(1 if form == "shared" else 6, 4, generator=gen, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: rbf_grid_linear_reference(a, b, -2.0, 2.0), (x, w))
    assert torch.autograd.gradcheck(lambda a, b: rbf_grid_linear(a, b, -2.0, 2.0, backend="torch"), (x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("form", ["shared", "channel"])
def test_torch_backend_equals_reference(form: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    x = (1.5 * torch.randn(9, 5, 11, generator=gen)).to(dtype)
    w = torch.randn(1 if form == "shared" else 11, 8, generator=gen)
    dy = torch.randn(9, 5, 11, generator=gen).to(dtype)
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    ya = rbf_grid_linear(xa, wa, -2.0, 2.0, backend="torch")
    ya.backward(dy)
    xb, wb = x.clone().requires_grad_(), w.clone().requires_grad_()
    yb = rbf_grid_linear_reference(xb, wb, -2.0, 2.0)
    yb.backward(dy)
    assert torch.equal(ya, yb) and ya.dtype == dtype
    assert xa.grad.dtype == dtype and wa.grad.dtype == w.dtype and wa.grad.shape == w.shape
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
    assert_close(xa.grad.double(), xb.grad.double(), rtol=tol, atol=tol)
    assert_close(wa.grad, wb.grad, rtol=1e-5, atol=1e-5)
    assert torch.equal(rbf_grid_linear(x, w, -2.0, 2.0), ya.detach())  # auto on CPU is the torch path


@pytest.mark.parametrize("form", ["shared", "channel"])
def test_torch_path_is_the_same_under_autocast(form: str) -> None:
    """The reference's sums over the grid stay in its dtype under bf16 autocast (the KAN paths are checked against it
    inside an autocast forward): at x = 0 with near-symmetric grid weights they cancel, and a bf16 sum was 6 % off."""
    gen = torch.Generator().manual_seed(5)
    x = torch.cat([torch.zeros(64, 11), 1.5 * torch.randn(64, 11, generator=gen)])
    w = torch.tensor([1.0, -0.5, -0.5 + 1e-3, 1.0]).repeat(1 if form == "shared" else 11, 1)
    dy = torch.randn(128, 11, generator=gen)
    plain = backward_and_output(x, w, dy, -2.0, 2.0, False, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = backward_and_output(x, w, dy, -2.0, 2.0, False, torch.float32)
        forward = rbf_grid_linear(x, w, -2.0, 2.0, backend="torch")
    assert all(torch.equal(a, b) for a, b in zip(under, plain, strict=True)), form
    assert torch.equal(forward, plain[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("form", ["shared", "channel"])
def test_torch_backward_with_output_is_the_reference_exactly(form: str, dtype: torch.dtype) -> None:
    """The torch path's backward_and_output (the KAN layers' CPU backward, which forms the basis once for the
    gradients and psi): psi equal to the reference's, in x's dtype and in bf16, the gradients to the plain ones."""
    gen = torch.Generator().manual_seed(4)
    x = (1.5 * torch.randn(9, 5, 11, generator=gen)).to(dtype)
    w = torch.randn(1 if form == "shared" else 11, 8, generator=gen)
    dy = torch.randn(9, 5, 11, generator=gen).to(dtype)
    plain = torch.autograd.grad(rbf_grid_linear(x.requires_grad_(), w.requires_grad_(), -2.0, 2.0), [x, w], dy)
    for out_dtype in (dtype, torch.bfloat16):
        dx, dw, y = backward_and_output(x.detach(), w.detach(), dy, -2.0, 2.0, False, out_dtype)
        expected = rbf_grid_linear_reference(x.detach(), w.detach(), -2.0, 2.0).to(out_dtype)
        assert torch.equal(y, expected) and y.dtype == out_dtype and y.is_contiguous(), out_dtype
        assert torch.equal(dx, plain[0]) and torch.equal(dw, plain[1]), out_dtype


def test_op_saves_only_x_and_weight() -> None:
    x = torch.randn(6, 10, requires_grad=True)
    w = torch.randn(10, 16, requires_grad=True)
    y = rbf_grid_linear(x, w, -2.0, 2.0, backend="torch")
    saved = y.grad_fn.saved_tensors
    assert len(saved) == 2 and saved[0] is x and saved[1] is w


@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_torch_backend_huge_inputs_finite(grid: tuple[float, float]) -> None:
    x = torch.tensor(HUGE + [-v for v in HUGE]).repeat(2, 1).requires_grad_()
    w = torch.randn(x.shape[1], 16, requires_grad=True)
    y = rbf_grid_linear(x, w, *grid, backend="torch")
    y.sum().backward()
    ref = _fp64_fwd_bwd(x.detach(), w.detach(), torch.ones_like(x), grid)
    for out, r in zip((y.detach(), x.grad, w.grad), ref, strict=True):
        assert torch.isfinite(out).all()
        assert (out.double() - r).abs().max() <= 1e-5 * r.abs().max()


def test_input_validation() -> None:
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="weight must be"):
        rbf_grid_linear(x, torch.randn(3, 5), -2.0, 2.0)
    with pytest.raises(ValueError, match="unknown backend"):
        rbf_grid_linear(x, torch.randn(5), -2.0, 2.0, backend="cuda")
    with pytest.raises(ValueError, match="num_grids >= 2"):
        rbf_grid_linear(x, torch.randn(1), -2.0, 2.0)
    with pytest.raises(ValueError, match="grid_max > grid_min"):
        rbf_basis(x, 2.0, -2.0, 4)
    with pytest.raises(ValueError, match="triton backend"):
        rbf_grid_linear(x.double(), torch.randn(5), -2.0, 2.0, backend="triton")


if __name__ == "__main__":
    triton_interpreter.report(interpreter_measurements)
