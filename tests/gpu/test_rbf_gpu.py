"""The fused RBF grid-linear Triton kernels on CUDA against a float64 reference, up to 1e8 elements."""

from __future__ import annotations

import pytest
import torch

from lkat_lens.kernels.rbf import backward_and_output, rbf_grid_linear, rbf_grid_linear_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# ||out - ref|| / ||ref|| for y and dx (output dtype) and dw (fp32 accumulation, returned in fp32).
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
DW_TOL = 1e-4
GRIDS = [(-2.0, 2.0), (-1.0, 1.0)]


def _operands(
    form: str, rows: int, D: int, G: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x ~ 1.5 N(0,1) (spills past the grid), a weight of the given form and an upstream gradient."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (1.5 * torch.randn(rows, D, device="cuda", generator=gen)).to(dtype)
    w = torch.randn(1 if form == "shared" else D, G, device="cuda", generator=gen)
    dy = torch.randn(rows, D, device="cuda", generator=gen).to(dtype)
    return x, w, dy


def _triton_fwd_bwd(
    x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, lo: float, hi: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, dx, dw) of the fused op."""
    xt, wt = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = rbf_grid_linear(xt, wt, lo, hi, backend="triton")
    y.backward(dy)
    return y.detach(), xt.grad, wt.grad


def _rel_errors(
    x: torch.Tensor,
    w: torch.Tensor,
    dy: torch.Tensor,
    y: torch.Tensor,
    dx: torch.Tensor,
    dw: torch.Tensor,
    lo: float,
    hi: float,
    chunk_elems: int = 1 << 23,
) -> dict[str, float]:
    """Relative errors of (y, dx, dw) against the float64 reference, evaluated in row chunks."""
    step = max(1, chunk_elems // x.shape[1])
    sq = {k: torch.zeros(2, device="cuda", dtype=torch.float64) for k in ("y", "dx")}
    dw_ref = torch.zeros_like(w, dtype=torch.float64)
    for start in range(0, x.shape[0], step):
        sl = slice(start, start + step)
        xr = x[sl].double().requires_grad_()
        wr = w.double().requires_grad_()
        yr = rbf_grid_linear_reference(xr, wr, lo, hi)
        yr.backward(dy[sl].double())
        dw_ref += wr.grad
        for key, out, ref in (("y", y[sl], yr.detach()), ("dx", dx[sl], xr.grad)):
            sq[key] += torch.stack([(out.double() - ref).square().sum(), ref.square().sum()])
    errors = {k: (v[0] / v[1]).sqrt().item() for k, v in sq.items()}
    errors["dw"] = ((dw.double() - dw_ref).norm() / dw_ref.norm()).item()
    return errors


@pytest.mark.parametrize("grid", GRIDS, ids=str)
@pytest.mark.parametrize("G", [2, 4, 8, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("form", ["shared", "channel"])
def test_matches_fp64_reference(form: str, dtype: torch.dtype, G: int, grid: tuple[float, float]) -> None:
    x, w, dy = _operands(form, 4099, 771, G, dtype, seed=G)
    y, dx, dw = _triton_fwd_bwd(x, w, dy, *grid)
    assert y.dtype == dx.dtype == dtype and dw.dtype == torch.float32 and dw.shape == w.shape
    errors = _rel_errors(x, w, dy, y, dx, dw, *grid)
    assert errors["y"] <= TOL[dtype] and errors["dx"] <= TOL[dtype], errors
    assert errors["dw"] <= DW_TOL, errors


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("form", ["shared", "channel"])
def test_1e8_elements_fp64_reference_and_memory(form: str, dtype: torch.dtype) -> None:
    x, w, dy = _operands(form, 100_000, 1000, 8, dtype, seed=1)
    _triton_fwd_bwd(x, w, dy, -2.0, 2.0)  # compile and autotune (keyed on the rows too) outside the memory window
    xt, wt = x.clone().requires_grad_(), w.clone().requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    y = rbf_grid_linear(xt, wt, -2.0, 2.0, backend="triton")
    y.backward(dy)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    # y and dx, plus small dw partials: never the [N, G] basis (8x x's bytes even in bf16).
    assert extra <= 2 * x.nbytes + (64 << 20), extra / x.nbytes
    errors = _rel_errors(x, w, dy, y.detach(), xt.grad, wt.grad, -2.0, 2.0)
    assert errors["y"] <= TOL[dtype] and errors["dx"] <= TOL[dtype], errors
    assert errors["dw"] <= DW_TOL, errors


@pytest.mark.parametrize("form", ["shared", "channel"])
def test_backward_is_deterministic(form: str) -> None:
    x, w, dy = _operands(form, 50_000, 384, 8, torch.float32, seed=2)
    first = _triton_fwd_bwd(x, w, dy, -2.0, 2.0)
    second = _triton_fwd_bwd(x, w, dy, -2.0, 2.0)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_huge_inputs_stay_finite(dtype: torch.dtype) -> None:
    big = [3e38, 1e30, 1e4, 30.0, 5.0, 0.3, 0.0]
    x = torch.tensor(big + [-v for v in big], device="cuda").to(dtype).repeat(37, 1)
    w = torch.randn(x.shape[1], 16, device="cuda")
    y, dx, dw = _triton_fwd_bwd(x, w, torch.ones_like(x), -1.0, 1.0)
    assert all(torch.isfinite(t).all() for t in (y, dx, dw))
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    rbf_grid_linear_reference(xr, wr, -1.0, 1.0).sum().backward()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    scale = w.abs().sum(-1).max().item() * 15
    assert (dx.double() - xr.grad).abs().max().item() <= tol * scale
    assert (dw.double() - wr.grad).abs().max().item() <= 1e-4 * x.shape[0]


def test_auto_backend_and_layouts() -> None:
    x, w, dy = _operands("channel", 1000, 96, 4, torch.float32, seed=3)
    auto = rbf_grid_linear(x, w, -2.0, 2.0)
    assert torch.equal(auto, rbf_grid_linear(x, w, -2.0, 2.0, backend="triton"))
    xt = x.t().contiguous().t()  # same values, column-major storage
    assert not xt.is_contiguous() and torch.equal(rbf_grid_linear(xt, w, -2.0, 2.0), auto)
    x64 = x.double()  # float64 is not a Triton dtype: auto takes the exact torch path
    assert torch.equal(rbf_grid_linear(x64, w, -2.0, 2.0), rbf_grid_linear_reference(x64, w, -2.0, 2.0))
    shared = torch.randn(4, device="cuda")
    three_d = x.reshape(10, 100, 96)
    assert torch.equal(rbf_grid_linear(three_d, shared, -2.0, 2.0).reshape_as(x), rbf_grid_linear(x, shared, -2.0, 2.0))


@pytest.mark.parametrize("form", ["shared", "channel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_backward_writes_the_forwards_output(form: str, dtype: torch.dtype) -> None:
    """The backward that also writes y (the KAN layer's eager paths read psi from it): y in x's dtype and in bf16 as
    the forward kernel writes it, to one rounding of y's dtype, the same dx as the plain backward and its dw to fp32
    summation order: dw adds the rows in one partial sum per program, and where y's dtype is not x's the autotuner
    (whose key holds the operands' dtypes) tunes this kernel apart from the plain one; another row tile groups the rows
    differently (H100: 512 against 256 rows, dw 5e-7 apart relative to its largest value at fp32, shared form)."""
    x, w, dy = _operands(form, 4099, 768, 4, dtype, seed=7)
    _, dx, dw = _triton_fwd_bwd(x, w, dy, *GRIDS[0])
    for out_dtype in (dtype, torch.bfloat16):
        got_dx, got_dw, y = backward_and_output(x, w, dy, *GRIDS[0], True, out_dtype)
        forward = rbf_grid_linear(x, w, *GRIDS[0], backend="triton", out_dtype=out_dtype)
        assert y.dtype == out_dtype and torch.equal(got_dx, dx)
        if out_dtype == x.dtype:  # the plain backward's own tuning key: the same kernel, the same sums
            assert torch.equal(got_dw, dw)
        else:  # a reordered sum of 4,099 rows x 768 channels: within 2^-17 of the largest |dw|
            assert ((got_dw - dw).abs() <= 2.0**-17 * dw.abs().max()).all()
        eps = torch.finfo(out_dtype).eps
        assert ((y.float() - forward.float()).abs() <= eps * forward.float().abs() + 1e-30).all()
