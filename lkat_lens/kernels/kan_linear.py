"""The spline part of an RBF-KAN layer: exact torch references, fused autograd ops and the path choice.

shared / channel: y = psi(x) W^T, psi(x) = sum_g w_g phi_g(x) per element (w [1, G] or [in, G], W [out, in]).
edge (FastKAN):   y = Phi(x) W^T, Phi(x)[..., p*G + g] = phi_g(x_p) (W [out, in*G]).

Paths: "torch" (shared/channel: the elementwise op on its torch path, then a matmul; edge: the basis
materialised, then a matmul), "triton" (shared/channel: the elementwise Triton kernel, then cuBLAS; in eager mode
both save only x and the weights, psi being formed again by the op's backward for W's gradient),
"fused" (the kernels of kan_triton: the basis is evaluated inside the matmul and only x is saved for
backward; the backward kernel writes psi for W's gradient, a cuBLAS GEMM), "traced" (shared/channel: the exact
formula and an explicit backward as plain torch ops, no custom op, for torch.compile: inductor fuses the basis, its
weighted sum and the cast into one elementwise kernel before cuBLAS, and the backward recomputes the basis from x,
the only activation saved).
Backend "auto" measures "triton" and "fused" once per layer shape on CUDA and keeps the fastest correct
one (kan_dispatch); elsewhere it is the torch path; while torch.compile traces it is "traced". Under CUDA
autocast every path multiplies in the autocast dtype and returns it, as nn.Linear does.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from .autograd_ops import EagerGraphs, Kernel, differentiable, eager_graphs, traced
from .dtypes import autocast_dtype, compute_dtype
from .kan_dispatch import choose_path
from .rbf import (
    TRITON_DTYPES,
    _forward,
    _gaussian,
    _grid_weight,
    _scaled_offsets,
    _torch_backward,
    backward_and_output,
    check_grid,
    rbf_basis,
    rbf_grid_linear,
    rbf_grid_linear_reference,
    uses_triton,
)

try:
    from . import kan_triton
except ImportError:  # pragma: no cover - triton is a declared dependency, absent only on exotic platforms
    kan_triton = None

PATHS = ("torch", "triton", "fused")  # the eager paths "auto" chooses from
TRACED = "traced"
BACKENDS = ("auto", *PATHS, TRACED)


def kan_linear_reference(
    x: torch.Tensor, grid_weight: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float
) -> torch.Tensor:
    """Exact unfused y = psi(x) W^T: the elementwise reference, then a matmul in W's dtype."""
    return F.linear(rbf_grid_linear_reference(x, grid_weight, grid_min, grid_max).to(weight.dtype), weight)


def edge_linear_reference(
    x: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float, num_grids: int
) -> torch.Tensor:
    """Exact unfused y = Phi(x) W^T with the [..., in*G] basis materialised (FastKAN's computation)."""
    return F.linear(rbf_basis(x, grid_min, grid_max, num_grids).flatten(-2).to(weight.dtype), weight)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as [rows, last dim] (a view where possible)."""
    return t.reshape(-1, t.shape[-1])


# The fused kernels as torch custom ops (forward, backward), so that torch.compile keeps each in its graph as one
# opaque call. A gradient that is not needed comes back as an empty tensor (custom ops return tensors only). On the
# CPU without the Triton interpreter the ops compute the exact references (the backward by explicit formulas), so that
# their registrations can be checked there (torch.library.opcheck).


def _kernels_run_on(t: torch.Tensor) -> bool:
    """Whether the Triton kernels run on t's device: CUDA, or the CPU under the interpreter (triton present)."""
    return kan_triton is not None and (t.is_cuda or kan_triton.INTERPRET)


def _fp32_or_more(t: torch.Tensor) -> torch.Tensor:
    """t in its compute dtype: fp32, or as it is when fp64 (the CPU references' compute dtype)."""
    return t.to(compute_dtype(t))


def _empty(t: torch.Tensor) -> torch.Tensor:
    """The stand-in for a gradient that was not asked for."""
    return t.new_empty(0)


def _kan_fused_forward(x, grid_weight, weight, grid_min, grid_max):
    """y = psi(x) W^T [..., out] in W's dtype: psi evaluated inside the matmul kernel (CUDA, or the interpreter),
    else the exact reference."""
    if not _kernels_run_on(x):
        return kan_linear_reference(x, grid_weight, weight, grid_min, grid_max).contiguous()
    y = kan_triton.kan_fwd(_rows(x), grid_weight, weight, grid_min, grid_max)
    return y.view(*x.shape[:-1], weight.shape[0])


@torch.library.custom_op("lkat_lens::kan_fused", mutates_args=())
def _kan_fused_op(
    x: torch.Tensor, grid_weight: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float
) -> torch.Tensor:
    """The forward (_kan_fused_forward) as a custom op."""
    return _kan_fused_forward(x, grid_weight, weight, grid_min, grid_max)


@_kan_fused_op.register_fake
def _kan_fused_fake(x, grid_weight, weight, grid_min, grid_max):
    return x.new_empty(*x.shape[:-1], weight.shape[0], dtype=weight.dtype)


@torch.library.custom_op("lkat_lens::kan_fused_backward", mutates_args=())
def _kan_fused_backward_op(
    x: torch.Tensor,
    grid_weight: torch.Tensor,
    weight: torch.Tensor,
    dy: torch.Tensor,
    grid_min: float,
    grid_max: float,
    need_dx: bool,
    need_dw: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward (_kan_fused_backward) as a custom op."""
    return _kan_fused_backward(x, grid_weight, weight, dy, grid_min, grid_max, need_dx, need_dw)


def _kan_fused_backward(x, grid_weight, weight, dy, grid_min, grid_max, need_dx, need_dw):
    """(dx, d grid_weight, dW) in the dtypes of x, grid_weight, W (empty where not needed; dx and d grid_weight come
    together): the fused kernels (CUDA, or the interpreter), else explicit formulas in fp32 (fp64 for fp64)."""
    if not _kernels_run_on(x):
        return _kan_backward_reference(x, grid_weight, weight, dy, grid_min, grid_max, need_dx, need_dw)
    dx, dgw, dw = kan_triton.kan_bwd(
        _rows(x), grid_weight, weight, _rows(dy), grid_min, grid_max, need_dx=need_dx, need_dw=need_dw
    )
    return (
        dx.view(x.shape) if need_dx else _empty(x),
        dgw.reshape(grid_weight.shape).to(grid_weight.dtype) if need_dx else _empty(grid_weight),
        dw if need_dw else _empty(weight),
    )


def _kan_backward_reference(x, grid_weight, weight, dy, grid_min, grid_max, need_dx, need_dw):
    """The fused backward's results by the explicit torch formulas."""
    x32, dy32 = _fp32_or_more(x), _fp32_or_more(dy)
    dx, dgw = _torch_backward(x32, grid_weight, dy32 @ _fp32_or_more(weight), grid_min, grid_max)
    dw = _rows(dy32).T @ _rows(rbf_grid_linear_reference(x32, grid_weight, grid_min, grid_max))
    return (
        dx.to(x.dtype) if need_dx else _empty(x),
        dgw if need_dx else _empty(grid_weight),
        dw.to(weight.dtype) if need_dw else _empty(weight),
    )


@_kan_fused_backward_op.register_fake
def _kan_fused_backward_fake(x, grid_weight, weight, dy, grid_min, grid_max, need_dx, need_dw):
    return (
        x.new_empty(x.shape) if need_dx else _empty(x),
        grid_weight.new_empty(grid_weight.shape) if need_dx else _empty(grid_weight),
        weight.new_empty(weight.shape) if need_dw else _empty(weight),
    )


def _kan_setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    x, grid_weight, weight, grid_min, grid_max = inputs
    ctx.save_for_backward(x, grid_weight, weight)
    ctx.grid = (grid_min, grid_max)


def _kan_backward(ctx: Any, dy: torch.Tensor, kernel) -> tuple[torch.Tensor | None, ...]:
    need_x, need_gw, need_w = ctx.needs_input_grad[:3]
    dx, dgw, dw = kernel(*ctx.saved_tensors, dy, *ctx.grid, need_x or need_gw, need_w)
    return (dx if need_x else None), (dgw if need_gw else None), (dw if need_w else None), None, None


_kan_fused = differentiable(
    Kernel(_kan_fused_op, _kan_fused_forward),
    Kernel(_kan_fused_backward_op, _kan_fused_backward),
    _kan_backward,
    _kan_setup_context,
)


def _edge_fused_forward(x, weight, grid_min, grid_max, num_grids):
    """y = Phi(x) W^T [..., out] in W's dtype: the basis generated inside the matmul kernel (CUDA, or the
    interpreter), else the exact reference."""
    if not _kernels_run_on(x):
        return edge_linear_reference(x, weight, grid_min, grid_max, num_grids).contiguous()
    y = kan_triton.edge_fwd(_rows(x), weight, grid_min, grid_max, num_grids)
    return y.view(*x.shape[:-1], weight.shape[0])


@torch.library.custom_op("lkat_lens::edge_fused", mutates_args=())
def _edge_fused_op(
    x: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float, num_grids: int
) -> torch.Tensor:
    """The forward (_edge_fused_forward) as a custom op."""
    return _edge_fused_forward(x, weight, grid_min, grid_max, num_grids)


@_edge_fused_op.register_fake
def _edge_fused_fake(x, weight, grid_min, grid_max, num_grids):
    return x.new_empty(*x.shape[:-1], weight.shape[0], dtype=weight.dtype)


@torch.library.custom_op("lkat_lens::edge_fused_backward", mutates_args=())
def _edge_fused_backward_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    dy: torch.Tensor,
    grid_min: float,
    grid_max: float,
    num_grids: int,
    need_dx: bool,
    need_dw: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward (_edge_fused_backward) as a custom op."""
    return _edge_fused_backward(x, weight, dy, grid_min, grid_max, num_grids, need_dx, need_dw)


def _edge_fused_backward(x, weight, dy, grid_min, grid_max, num_grids, need_dx, need_dw):
    """(dx, dW) in the dtypes of x and W (empty where not needed): the fused kernels (CUDA, or the interpreter),
    else explicit formulas in fp32 (fp64 for fp64)."""
    if not _kernels_run_on(x):
        return _edge_backward_reference(x, weight, dy, grid_min, grid_max, num_grids, need_dx, need_dw)
    dx, dw = kan_triton.edge_bwd(
        _rows(x), weight, _rows(dy), grid_min, grid_max, num_grids, need_dx=need_dx, need_dw=need_dw
    )
    return (dx.view(x.shape) if need_dx else _empty(x)), (dw if need_dw else _empty(weight))


def _edge_backward_reference(x, weight, dy, grid_min, grid_max, num_grids, need_dx, need_dw):
    """The fused edge backward's results by the explicit torch formulas."""
    t = _scaled_offsets(_fp32_or_more(x), grid_min, grid_max, num_grids)
    phi = _gaussian(t, inplace=False)
    dphi = (_fp32_or_more(dy) @ _fp32_or_more(weight)).unflatten(-1, phi.shape[-2:])
    dx = (dphi * phi * t).sum(-1) * (-2.0 * (num_grids - 1) / (grid_max - grid_min))
    dw = _rows(_fp32_or_more(dy)).T @ _rows(phi.flatten(-2))
    return (dx.to(x.dtype) if need_dx else _empty(x)), (dw.to(weight.dtype) if need_dw else _empty(weight))


@_edge_fused_backward_op.register_fake
def _edge_fused_backward_fake(x, weight, dy, grid_min, grid_max, num_grids, need_dx, need_dw):
    return (x.new_empty(x.shape) if need_dx else _empty(x)), (
        weight.new_empty(weight.shape) if need_dw else _empty(weight)
    )


def _edge_setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    x, weight, *grid = inputs
    ctx.save_for_backward(x, weight)
    ctx.grid = tuple(grid)


def _edge_backward(ctx: Any, dy: torch.Tensor, kernel) -> tuple[torch.Tensor | None, ...]:
    need_x, need_w = ctx.needs_input_grad[:2]
    dx, dw = kernel(*ctx.saved_tensors, dy, *ctx.grid, need_x, need_w)
    return (dx if need_x else None), (dw if need_w else None), None, None, None


_edge_fused = differentiable(
    Kernel(_edge_fused_op, _edge_fused_forward),
    Kernel(_edge_fused_backward_op, _edge_fused_backward),
    _edge_backward,
    _edge_setup_context,
)


# The traced path's basis goes by spans of up to four Gaussians, two exponentials per span, as the Triton RBF kernel
# does (rbf_triton): with v = (x - c_a) / h for the span's first center a, phi_{a+j} = exp(-v^2) exp(2v)^j e^{-j^2}.
# Four exponentials per element made inductor's fused kernels compute-bound (about 100 instructions per element, the
# libdevice exp and NaN-propagating clamps; generated code of the H100 runs). v is clamped to _SPAN_V, as
# rbf_triton clamps it (its _SPAN and _CLAMP): there every phi of the span is below e^-100 and exp(2v)^3 stays
# finite in fp32.
_SPAN, _SPAN_CLAMP = 4, 10.0
_SPAN_V = (-_SPAN_CLAMP, _SPAN_CLAMP + _SPAN - 1)
# The exponentials are taken as exp2 of a scaled argument: inductor emits exp2 as one hardware exp2 and a few
# instructions less per element than exp's range reduction (the basis kernels are bound by their instructions).
_LOG2E = math.log2(math.e)


def _gaussians(
    x: torch.Tensor, grid_weight: torch.Tensor, grid_min: float, grid_max: float
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(w_g, phi_g(x), t_g) of each Gaussian g, in x's dtype (fp32 or fp64): w_g a 0-d (shared) or [in] (channel)
    column of the grid weights, phi_g from its span's two exponentials, t_g = (x - c_g) / h (from the span's clamped
    v, so that t_g * phi_g stays finite; where it is clamped every phi of the span is below e^-100)."""
    w = _grid_weight(x, grid_weight).to(x.dtype)
    num_grids = w.shape[-1]
    inv_h = (num_grids - 1) / (grid_max - grid_min)
    u = (x - grid_min) * inv_h
    terms = []
    for first in range(0, num_grids, _SPAN):
        v = (u - first).clamp(*_SPAN_V)
        phi, ratio = torch.exp2(v.square() * -_LOG2E), torch.exp2(v * (2.0 * _LOG2E))
        for j in range(min(_SPAN, num_grids - first)):
            if j:
                phi = phi * ratio * math.exp(1 - 2 * j)  # phi_{a+j} / phi_{a+j-1} = exp(2v) e^{-(2j - 1)}
            terms.append((w[..., first + j], phi, v - j))
    return terms


class _TracedKan(torch.autograd.Function):
    """psi(x) W^T with an explicit backward of plain torch ops, taken one Gaussian at a time (no [..., in, G]
    tensor), saving only x and the weights: the "traced" path, which torch.compile traces forward and backward.
    The matmuls run in `dtype` (the autocast dtype under autocast), the basis and its gradients in fp32 (fp64 for
    fp64 x); dy @ W and dy^T psi round as F.linear's backward does under autocast. Shared grid weights take their
    gradient as sums per row first, then over the rows: inductor fuses those row sums into the kernel that writes dx
    and psi (a sum over all elements is a reduction kernel of its own, which reads x and dpsi again)."""

    @staticmethod
    def forward(x, grid_weight, weight, grid_min, grid_max, dtype):
        psi = sum(w * phi for w, phi, _ in _gaussians(_fp32_or_more(x), grid_weight, grid_min, grid_max))
        return F.linear(psi.to(dtype), weight.to(dtype))

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, grid_weight, weight, grid_min, grid_max, dtype = inputs
        ctx.save_for_backward(x, grid_weight, weight)
        ctx.args = (grid_min, grid_max, dtype)

    @staticmethod
    def backward(ctx, dy):
        x, grid_weight, weight = ctx.saved_tensors
        grid_min, grid_max, dtype = ctx.args
        xc = _fp32_or_more(x)
        dpsi = (dy.to(dtype) @ weight.to(dtype)).to(xc.dtype)
        psi, slope, dgw = 0.0, 0.0, []
        shared = grid_weight.numel() == grid_weight.shape[-1]
        for w, phi, t in _gaussians(xc, grid_weight, grid_min, grid_max):
            psi, slope = psi + w * phi, slope + w * phi * t
            contribution = dpsi * phi
            dgw.append(contribution.sum(-1) if shared else _rows(contribution).sum(0))
        h = (grid_max - grid_min) / (len(dgw) - 1)
        dx = (dpsi * slope * (-2.0 / h)).to(x.dtype) if ctx.needs_input_grad[0] else None
        if ctx.needs_input_grad[1]:
            dgw = torch.stack(dgw, -1)
            dgw = (_rows(dgw).sum(0) if shared else dgw).reshape(grid_weight.shape).to(grid_weight.dtype)
        else:
            dgw = None
        dw = None
        if ctx.needs_input_grad[2]:
            dw = (_rows(dy.to(dtype)).T @ _rows(psi.to(dtype))).to(weight.dtype)
        return dx, dgw, dw, None, None, None


def recomputed_kan_fwd(
    x: torch.Tensor, grid_weight: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float,
    use_triton: bool, dtype: torch.dtype, weight_grad: bool,
) -> tuple[torch.Tensor]:  # fmt: skip
    """(psi(x) W^T,) with psi from the RBF op (its Triton kernel or the torch reference; the "triton" and "torch"
    paths), written in `dtype` (the autocast dtype under autocast), in which the matmul runs and rounds as F.linear's
    does under autocast. weight_grad: whether the backward forms W's gradient."""
    return (F.linear(_forward(x, grid_weight, grid_min, grid_max, use_triton, dtype), weight.to(dtype)),)


def recomputed_kan_bwd(
    x: torch.Tensor, grid_weight: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, grid_min: float,
    grid_max: float, use_triton: bool, dtype: torch.dtype, weight_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """(dx, d grid weights, dW or None) for dy: psi formed again, by the pass that computes dx and the grid weights'
    gradient (the Triton backward writes it from that pass: a store, not a kernel), instead of saved: F.linear after
    the op would keep psi, as large as x, for W's gradient."""
    w, dy = weight.to(dtype), dy.to(dtype)
    dx, dgw, psi = backward_and_output(x, grid_weight, dy @ w, grid_min, grid_max, use_triton, dtype)
    dw = (_rows(dy).T @ _rows(psi)).to(weight.dtype) if weight_grad else None
    return dx, dgw, dw


def _recomputed_setup(ctx, inputs: tuple, output: tuple) -> None:
    """Saves x, the grid weights and W (the parameters themselves: nothing as large as x but x)."""
    ctx.save_for_backward(*inputs[:3])
    ctx.args = inputs[3:]


def _recomputed_backward(ctx, dy: torch.Tensor, kernel) -> tuple:
    return *kernel(*ctx.saved_tensors, dy, *ctx.args), *[None] * len(ctx.args)


# the shared/channel layer on the "triton" and "torch" paths in eager mode (never traced: torch.compile takes "traced")
_recomputed_kan = traced("kan_layer", recomputed_kan_fwd, recomputed_kan_bwd, _recomputed_backward, _recomputed_setup)


def kan_pair_fwd(
    x: torch.Tensor, grid_weight_1: torch.Tensor, weight_1: torch.Tensor, grid_weight_2: torch.Tensor,
    weight_2: torch.Tensor, grid_1: tuple[float, float], grid_2: tuple[float, float], use_triton: bool,
    dtype: torch.dtype, weight_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(y, h): two shared/channel layers in a row, h the first's output and y the second's, each on the path
    recomputed_kan_fwd takes (`use_triton` for both); grid_1, grid_2 the layers' (grid_min, grid_max)."""
    (h,) = recomputed_kan_fwd(x, grid_weight_1, weight_1, *grid_1, use_triton, dtype, weight_grad)
    (y,) = recomputed_kan_fwd(h, grid_weight_2, weight_2, *grid_2, use_triton, dtype, weight_grad)
    return y, h


def kan_pair_bwd(
    x: torch.Tensor, grid_weight_1: torch.Tensor, weight_1: torch.Tensor, grid_weight_2: torch.Tensor,
    weight_2: torch.Tensor, h: torch.Tensor, dy: torch.Tensor, grid_1: tuple[float, float],
    grid_2: tuple[float, float], use_triton: bool, dtype: torch.dtype, weight_grad: bool,
) -> tuple[torch.Tensor | None, ...]:  # fmt: skip
    """(dx, the first layer's grid-weight and W gradients, the second's) for dy: recomputed_kan_bwd of the second
    layer, then of the first."""
    dh, dgw_2, dw_2 = recomputed_kan_bwd(h, grid_weight_2, weight_2, dy, *grid_2, use_triton, dtype, weight_grad)
    dx, dgw_1, dw_1 = recomputed_kan_bwd(x, grid_weight_1, weight_1, dh, *grid_1, use_triton, dtype, weight_grad)
    return dx, dgw_1, dw_1, dgw_2, dw_2


_PAIR_TENSORS = 5  # kan_pair_fwd's tensor inputs; its other arguments follow


def _pair_setup(ctx, inputs: tuple, output: tuple) -> None:
    """Saves x, both layers' weights (the parameters themselves) and h."""
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(*inputs[:_PAIR_TENSORS], output[1])
    ctx.args = inputs[_PAIR_TENSORS:]


def _pair_backward(ctx, dy: torch.Tensor, _dh: None, kernel) -> tuple:
    return *kernel(*ctx.saved_tensors, dy, *ctx.args), *[None] * len(ctx.args)


_kan_pair = traced("kan_pair", kan_pair_fwd, kan_pair_bwd, _pair_backward, _pair_setup)


def kan_pair_graphs() -> EagerGraphs:
    """A KAN MLP's empty CUDA-graph captures of kan_pair (its `graphs`): x moves from call to call, and in the
    backward dy (after the 5 tensor inputs and h); the weights and what the forward saved stay in place."""
    return eager_graphs(kan_pair_fwd, kan_pair_bwd, moving=0, dz=_PAIR_TENSORS + 1)


def kan_pair(
    x: torch.Tensor,
    first: tuple[torch.Tensor, torch.Tensor, float, float],
    second: tuple[torch.Tensor, torch.Tensor, float, float],
    *,
    graphs: EagerGraphs | None = None,
) -> torch.Tensor:
    """Two shared/channel layers in a row, kan_linear(kan_linear(x, *first), *second) on the "triton" path where the
    RBF kernel takes x (else the torch path), as one computation: first and second are (grid weights, W, grid_min,
    grid_max). graphs (kan_pair_graphs(), one per MLP): on CUDA outside torch.compile, the forward and backward
    replayed as CUDA graphs once captured (kernels/graphed.py); the hidden activation is then neither copied in nor
    cloned out."""
    (grid_weight_1, weight_1, *grid_1), (grid_weight_2, weight_2, *grid_2) = first, second
    use_triton = uses_triton(x, grid_weight_1, *grid_1, "auto")  # h takes what x takes: its device, dtype or autocast's
    check_grid(*grid_2, grid_weight_2.shape[-1])
    dtype = autocast_dtype(x)
    grids = (tuple(float(g) for g in grid_1), tuple(float(g) for g in grid_2))
    tensors = (x, grid_weight_1, weight_1, grid_weight_2, weight_2)
    args = (*grids, use_triton, dtype, weight_1.requires_grad or weight_2.requires_grad)
    return _kan_pair(*tensors, *args, graphs=graphs)[0]


def _autocast_weight(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The weight in the autocast dtype when autocast is on for x's device (the fused ops multiply in W's dtype)."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return weight.to(torch.get_autocast_dtype(device))
    return weight


def _fused_capable(*tensors: torch.Tensor) -> bool:
    """Whether the fused kernels can take these operands (fp32/bf16/fp16 on CUDA, or under the interpreter)."""
    return all(t.dtype in TRITON_DTYPES and _kernels_run_on(t) for t in tensors)


def _run_kan(
    path: str, x: torch.Tensor, grid_weight: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float
) -> torch.Tensor:
    """Shared/channel layer on one path."""
    if path == "fused":
        return _kan_fused(x, grid_weight, _autocast_weight(x, weight), grid_min, grid_max)
    if path == TRACED:
        return _TracedKan.apply(x, grid_weight, weight, grid_min, grid_max, autocast_dtype(x))
    if torch.compiler.is_compiling():  # the RBF op (opaque to inductor) and F.linear: inductor decides what is saved
        return F.linear(
            rbf_grid_linear(x, grid_weight, grid_min, grid_max, backend=path, out_dtype=autocast_dtype(x)), weight
        )
    use_triton, dtype = uses_triton(x, grid_weight, grid_min, grid_max, path), autocast_dtype(x)
    return _recomputed_kan(x, grid_weight, weight, grid_min, grid_max, use_triton, dtype, weight.requires_grad)[0]


def _run_edge(
    path: str, x: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float, num_grids: int
) -> torch.Tensor:
    """Edge layer on one path."""
    if path == "fused":
        return _edge_fused(x, _autocast_weight(x, weight), grid_min, grid_max, num_grids)
    return edge_linear_reference(x, weight, grid_min, grid_max, num_grids)


def _check_backend(backend: str, fused_ok: bool) -> None:
    """Reject unknown backends and fused requests the operands cannot take."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {BACKENDS}")
    if backend == "fused" and not fused_ok:
        raise ValueError(f"the fused backend needs triton and x, weights in {TRITON_DTYPES} (on CUDA)")


def _check_span(grid_min: float, grid_max: float, num_grids: int) -> tuple[float, float]:
    """Where the path check draws its inputs: the grid and two spacings beyond each end (the Gaussians' tails)."""
    h = (grid_max - grid_min) / (num_grids - 1)
    return grid_min - 2 * h, grid_max + 2 * h


def _shape_key(basis: str, x: torch.Tensor, weight: torch.Tensor, num_grids: int) -> tuple:
    """What the path choice depends on: form, shapes, dtypes (autocast included), device and grad mode."""
    device = x.device.type
    autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    train = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return (basis, rows, x.shape[-1], weight.shape[0], num_grids, x.dtype, weight.dtype, autocast, str(x.device), train)


def kan_linear(
    x: torch.Tensor,
    grid_weight: torch.Tensor,
    weight: torch.Tensor,
    grid_min: float,
    grid_max: float,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """y = psi(x) W^T for grid weights [G], [1, G] (shared) or [in, G] (channel), differentiable in all three."""
    grid_min, grid_max = float(grid_min), float(grid_max)
    _check_backend(backend, backend != "fused" or _fused_capable(x, weight))
    path = backend
    if backend == "auto":
        path = "torch"
        if torch.compiler.is_compiling():
            path = TRACED
        elif x.is_cuda and _fused_capable(x, weight):

            def run(p: str, *args: torch.Tensor) -> torch.Tensor:
                return _run_kan(p, *args, grid_min, grid_max)

            key = _shape_key("kan", x, weight, grid_weight.shape[-1])
            span = _check_span(grid_min, grid_max, grid_weight.shape[-1])
            path = choose_path(key, PATHS, run, (x, grid_weight, weight), default="triton", span=span)
    return _run_kan(path, x, grid_weight, weight, grid_min, grid_max)


def edge_kan_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    grid_min: float,
    grid_max: float,
    num_grids: int,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """y = Phi(x) W^T for W [out, in*G], differentiable in x and W ("triton" means the fused kernels here, "traced"
    the torch path, which is plain torch ops already)."""
    grid_min, grid_max, num_grids = float(grid_min), float(grid_max), int(num_grids)
    if weight.shape[-1] != x.shape[-1] * num_grids:
        raise ValueError(f"weight must be [out, {x.shape[-1] * num_grids}], got {tuple(weight.shape)}")
    path = {"triton": "fused", TRACED: "torch"}.get(backend, backend)  # edge's torch path is plain torch ops
    _check_backend(path, path != "fused" or _fused_capable(x, weight))
    if path == "auto":
        path = "torch"
        if x.is_cuda and _fused_capable(x, weight):

            def run(p: str, *args: torch.Tensor) -> torch.Tensor:
                return _run_edge(p, *args, grid_min, grid_max, num_grids)

            key = _shape_key("edge", x, weight, num_grids)
            span = _check_span(grid_min, grid_max, num_grids)
            path = choose_path(key, ("torch", "fused"), run, (x, weight), default="torch", span=span)
    return _run_edge(path, x, weight, grid_min, grid_max, num_grids)
