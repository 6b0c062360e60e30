"""The fused RBF-KAN layer kernels on CUDA against a float64 reference, their memory, and the path choice."""

from __future__ import annotations

import time

import pytest
import torch

from lkat_lens.kernels import kan_dispatch
from lkat_lens.kernels.kan_linear import edge_kan_linear, edge_linear_reference, kan_linear, kan_linear_reference
from lkat_lens.models import KANLayer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GRID = (-2.0, 2.0)
# ||out - ref|| / ||ref||: y, dx, dW in the operand dtype; grid-weight grads accumulate in fp32.
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
DGW_TOL = 1e-4
# Ragged against every tile size: rows, in features, out features. Other shapes below keep sizes that are not
# multiples of 16, so that they reuse these compiled kernels (Triton specialises on divisibility by 16).
M, K, N = 1031, 203, 301


def _operands(form: str, G: int, dtype: torch.dtype, seed: int, shape: tuple[int, int, int] = (M, K, N)) -> tuple:
    """x ~ 1.5 N(0,1) (spills past the grid), grid weights, W and dy on CUDA."""
    rows, k, n = shape
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (1.5 * torch.randn(rows, k, device="cuda", generator=gen)).to(dtype)
    gw = torch.randn(1 if form == "shared" else k, G, device="cuda", generator=gen)
    W = (torch.randn(n, k * G if form == "edge" else k, device="cuda", generator=gen) / k**0.5).to(dtype)
    dy = torch.randn(rows, n, device="cuda", generator=gen).to(dtype)
    return x, gw, W, dy


def _run(form: str, x, gw, W, dy, backend: str | None) -> dict[str, torch.Tensor]:
    """y and grads of one forward+backward (the reference when backend is None)."""
    xt, gwt, Wt = (t.clone().requires_grad_() for t in (x, gw, W))
    G = gw.shape[-1]
    if form == "edge" and backend is None:
        y = edge_linear_reference(xt, Wt, *GRID, G)
    elif form == "edge":
        y = edge_kan_linear(xt, Wt, *GRID, G, backend=backend)
    elif backend is None:
        y = kan_linear_reference(xt, gwt, Wt, *GRID)
    else:
        y = kan_linear(xt, gwt, Wt, *GRID, backend=backend)
    y.backward(dy)
    out = {"y": y.detach(), "dx": xt.grad, "dW": Wt.grad}
    if form != "edge":
        out["dgw"] = gwt.grad
    return out


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize(
    "form,G,dtype",
    [(f, 8, torch.bfloat16) for f in ("shared", "channel", "edge")]
    + [(f, 8, torch.float32) for f in ("channel", "edge")]
    + [(f, G, torch.bfloat16) for f in ("shared", "edge") for G in (4, 16)],
    ids=str,
)
def test_fused_matches_fp64(form: str, G: int, dtype: torch.dtype) -> None:
    x, gw, W, dy = _operands(form, G, dtype, seed=G)
    fused = _run(form, x, gw, W, dy, "fused")
    ref = _run(form, x.double(), gw.double(), W.double(), dy.double(), None)
    errors = {k: _rel(fused[k], ref[k]) for k in fused}
    assert fused["y"].dtype == fused["dx"].dtype == fused["dW"].dtype == dtype
    for key, err in errors.items():
        assert err <= (DGW_TOL if key == "dgw" else TOL[dtype]), errors


@pytest.mark.parametrize("form", ["shared", "edge"])
def test_fused_memory_never_holds_the_basis(form: str) -> None:
    """Peak extra memory of forward+backward: y, dx, dW and small partials, never a basis [M, K, G] or [M, K*G]; the
    shared form's backward also holds psi [M, K] in W's dtype while cuBLAS forms dW from it (it is not saved)."""
    x, gw, W, dy = _operands(form, 8, torch.bfloat16, seed=1, shape=(16411, 507, 509))
    _run(form, x, gw, W, dy, "fused")  # compile and autotune (keyed on the rows too) outside the window
    xt, gwt, Wt = (t.clone().requires_grad_() for t in (x, gw, W))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    if form == "edge":
        y = edge_kan_linear(xt, Wt, *GRID, 8, backend="fused")
    else:
        y = kan_linear(xt, gwt, Wt, *GRID, backend="fused")
    saved = y.grad_fn.saved_tensors
    assert saved[0] is xt and all(any(s is t for t in (xt, gwt, Wt)) for s in saved)
    y.backward(dy)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    w_copies = 2 * W.nbytes  # dW, and the edge form's [N, G, K] view of W
    psi = 0 if form == "edge" else x.numel() * W.element_size()
    assert extra <= y.nbytes + x.nbytes + psi + w_copies + (8 << 20), extra / x.nbytes


def test_grid_weight_grad_is_deterministic() -> None:
    x, gw, W, dy = _operands("channel", 8, torch.float32, seed=2, shape=(20011, 203, 301))
    first, second = _run("channel", x, gw, W, dy, "fused"), _run("channel", x, gw, W, dy, "fused")
    assert all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize("form", ["shared", "edge"])
def test_autocast_bf16(form: str) -> None:
    """Under bf16 autocast with fp32 parameters and x: bf16 output, fp32 grads, close to the fp32 reference."""
    x, gw, W, dy = _operands(form, 8, torch.float32, seed=3)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        fused = _run(form, x, gw, W, dy.bfloat16(), "fused")
    ref = _run(form, x.double(), gw.double(), W.bfloat16().double(), dy.bfloat16().double(), None)
    assert fused["y"].dtype == torch.bfloat16 and fused["dx"].dtype == fused["dW"].dtype == torch.float32
    assert _rel(fused["y"], ref["y"]) <= 1e-2 and _rel(fused["dx"], ref["dx"]) <= 1e-2


@pytest.mark.parametrize("basis", ["shared", "edge"])
def test_auto_backend_picks_a_correct_path_once(basis: str) -> None:
    """KANLayer on CUDA with backend auto: one measurement per shape, the chosen path matches torch."""
    torch.manual_seed(0)
    layer = KANLayer(K, N, num_grids=8, basis=basis).cuda().bfloat16()
    x = torch.randn(7, 147, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    kan_dispatch.clear_choices()
    y = layer(x)
    choices = kan_dispatch.cached_choices()
    assert len(choices) == 1 and next(iter(choices.values())) in ("torch", "triton", "fused"), choices
    layer(x)
    assert kan_dispatch.cached_choices() == choices
    layer.kernel_backend = "torch"
    reference = layer(x)
    assert _rel(y, reference) <= 3e-2


def test_paths_are_timed_by_the_devices_time_not_the_hosts() -> None:
    """device_seconds of matmuls queued by a slow host (a 2 ms pause after each) is the matmuls' own device time,
    as CUDA events give it for the same matmuls queued back to back, not the pauses' wall time."""
    a = torch.randn(2048, 2048, device="cuda")
    for _ in range(3):
        a @ a  # cuBLAS picks and loads its kernel outside the timings
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(2**24)
    start.record()
    for _ in range(8):
        a @ a
    end.record()
    end.synchronize()
    back_to_back = start.elapsed_time(end) / 1e3

    def slow_host() -> None:
        for _ in range(8):
            a @ a
            time.sleep(0.002)

    measured = kan_dispatch.device_seconds(slow_host, a.device)
    assert back_to_back < 0.016  # 8 matmuls of 17 GFLOP each: well under the 16 ms the pauses take
    assert measured == pytest.approx(back_to_back, rel=0.25)
