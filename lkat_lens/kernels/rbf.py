"""The RBF grid-linear operator y = sum_g w_g exp(-((x - c_g) / h)^2): exact torch reference and fused op.

Centers c_g = linspace(grid_min, grid_max, G), bandwidth h = (grid_max - grid_min) / (G - 1). The weight
is `shared` ([G] or [1, G]: one curve for every element) or `channel` ([D, G], D = x.shape[-1]: one
curve per last-dim channel).
"""

from __future__ import annotations

from typing import Any

import torch

from .autograd_ops import Kernel, differentiable
from .dtypes import compute_dtype

try:
    from . import rbf_triton
except ImportError:  # pragma: no cover - triton is a declared dependency, absent only on exotic platforms
    rbf_triton = None

BACKENDS = ("auto", "torch", "triton")
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# |x - c| / h beyond this gives exp(-t^2) == 0 exactly even in float64; clamping keeps t * phi finite.
_T_MAX = 40.0


def check_grid(grid_min: float, grid_max: float, num_grids: int) -> None:
    """Reject grids without two ordered points (the one grid check of kernels and models)."""
    if num_grids < 2 or not grid_max > grid_min:
        raise ValueError(f"need num_grids >= 2 and grid_max > grid_min, got {num_grids}, [{grid_min}, {grid_max}]")


def _offsets(x: torch.Tensor, grid_min: float, grid_max: float, num_grids: int, *, planes: bool) -> torch.Tensor:
    """t = (x - c_g) / h in x's dtype, clamped where the Gaussian is exactly zero: [..., G], or [G, ...] planes.

    The RBF op's torch path works on planes, the grid index first: on the CPU its elementwise work then runs over
    long contiguous rows (a last dimension of G is several times slower), and in place (a fresh buffer costs about
    as much as the arithmetic on it). The [..., G] basis of the analyses is built in its own layout (a transposing
    copy of the planes cost the LKAT-B edge summary a fifth of its time)."""
    check_grid(grid_min, grid_max, num_grids)
    h = (grid_max - grid_min) / (num_grids - 1)
    centers = torch.linspace(grid_min, grid_max, num_grids, device=x.device, dtype=x.dtype)
    shifted = x - centers.view(-1, *[1] * x.dim()) if planes else x.unsqueeze(-1) - centers
    return shifted.div_(h).clamp_(-_T_MAX, _T_MAX)


def _scaled_offsets(x: torch.Tensor, grid_min: float, grid_max: float, num_grids: int) -> torch.Tensor:
    """t[..., g] = (x - c_g) / h (see _offsets)."""
    return _offsets(x, grid_min, grid_max, num_grids, planes=False)


def _offset_planes(x: torch.Tensor, grid_min: float, grid_max: float, num_grids: int) -> torch.Tensor:
    """t[g, ...] = (x - c_g) / h (see _offsets)."""
    return _offsets(x, grid_min, grid_max, num_grids, planes=True)


def _gaussian(t: torch.Tensor, *, inplace: bool = True) -> torch.Tensor:
    """exp(-t^2) of scaled offsets t, written over t unless inplace is False."""
    return (t.square_() if inplace else t.square()).neg_().exp_()


def rbf_basis(x: torch.Tensor, grid_min: float, grid_max: float, num_grids: int) -> torch.Tensor:
    """The Gaussian basis phi_g(x) as a [..., G] tensor in x's dtype (computed in fp32 for half inputs)."""
    xc = x if x.dtype in (torch.float32, torch.float64) else x.float()
    return _gaussian(_scaled_offsets(xc, grid_min, grid_max, num_grids)).to(x.dtype)


def _weighted_sum(planes: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_g w_g planes[g] for w [G] (one matrix-vector product) or w_{d,g} for w [D, G] (d the last dimension), in
    the planes' dtype: the product runs with autocast off, which would otherwise round it to bf16 (the sum cancels
    where the grid weights are near symmetric: at x = 0, the inputs of LKAT-B's fc2 at initialisation, the
    derivative's relative error reached 6 % and the CUDA path check took the torch path)."""
    if w.dim() == 1:
        with torch.autocast(planes.device.type, enabled=False):
            return (w @ planes.reshape(w.shape[0], -1)).view(planes.shape[1:])
    total = planes[0] * w[:, 0]
    for g in range(1, w.shape[1]):
        total.addcmul_(planes[g], w[:, g])
    return total


def _is_shared(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the weight is shared ([G] or [1, G]) rather than per channel ([D, G], D = x.shape[-1]); one clear error
    for any other shape."""
    if weight.dim() == 1 or (weight.dim() == 2 and weight.shape[0] == 1):
        return True
    if weight.dim() == 2 and x.dim() >= 1 and weight.shape[0] == x.shape[-1]:
        return False
    d = x.shape[-1] if x.dim() else None
    raise ValueError(f"weight must be [G], [1, G] or [D, G] with D = x.shape[-1] = {d}; got {tuple(weight.shape)}")


def _grid_weight(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The weight as [G] (shared) or [D, G] (channel), validated against x."""
    return weight.reshape(-1) if _is_shared(x, weight) else weight


def rbf_grid_linear_reference(x: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float) -> torch.Tensor:
    """Exact unfused y = sum_g w_g phi_g(x) (fp32, or fp64 for fp64 operands), returned in x's dtype."""
    w = _grid_weight(x, weight)
    dtype = compute_dtype(x, weight)
    phi = _gaussian(_offset_planes(x.to(dtype), grid_min, grid_max, w.shape[-1]))
    return _weighted_sum(phi, w.to(dtype)).to(x.dtype)


def _torch_backward(
    x: torch.Tensor,
    weight: torch.Tensor,
    dy: torch.Tensor,
    grid_min: float,
    grid_max: float,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, ...]:
    """(dx, dw) of the operator by explicit formulas, in the dtypes of x and weight; with `out_dtype`, also the
    forward's output in it from the same basis (the reference's values: the basis is formed once, not twice)."""
    w = _grid_weight(x, weight)
    dtype = compute_dtype(x, weight)
    num_grids = w.shape[-1]
    t = _offset_planes(x.to(dtype), grid_min, grid_max, num_grids)
    phi = _gaussian(t, inplace=False)
    wc, dyc = w.to(dtype), dy.to(dtype)
    h = (grid_max - grid_min) / (num_grids - 1)
    y = None if out_dtype is None else _weighted_sum(phi, wc).to(x.dtype).to(out_dtype).contiguous()
    dx = _weighted_sum(t.mul_(phi), wc).mul_(dyc).mul_(-2.0 / h)  # dy * sum_g w_g phi_g t_g * (-2 / h)
    columns = w.shape[0] if w.dim() == 2 else 1  # dw_g(, d) = sum over the rows of dy phi_g, summed pairwise by torch
    dw = phi.mul_(dyc).reshape(num_grids, -1, columns).sum(1).T.contiguous()
    grads = (dx.to(x.dtype), dw.reshape(weight.shape).to(weight.dtype))
    return grads if y is None else (*grads, y)


def _triton_operands(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x as the kernels' contiguous [rows, D] (D = 1 for a shared weight) and the weight as [D, G] (a view; the
    kernels run with gradients off, inside the op's forward and backward)."""
    shared = _is_shared(x, weight)
    x2d = x.reshape(-1, 1 if shared else weight.shape[0]).contiguous()
    return x2d, (weight.view(1, -1) if shared and weight.dim() == 1 else weight)


def _triton_forward(
    x: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float, out_dtype: torch.dtype
) -> torch.Tensor:
    """Fused forward on the Triton kernel, written in out_dtype."""
    x2d, w2d = _triton_operands(x, weight)
    return rbf_triton.rbf_grid_linear_fwd(x2d, w2d, grid_min, grid_max, out_dtype).view(x.shape)


def _triton_backward(
    x: torch.Tensor,
    weight: torch.Tensor,
    dy: torch.Tensor,
    grid_min: float,
    grid_max: float,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, ...]:
    """Fused backward on the Triton kernel: dx and dw in one pass, and with out_dtype the forward's output y in it."""
    x2d, w2d = _triton_operands(x, weight)
    dy2d = dy.reshape(x2d.shape).contiguous()
    dx, dw, *y = rbf_triton.rbf_grid_linear_bwd(x2d, w2d, dy2d, grid_min, grid_max, out_dtype)
    return dx.view(x.shape), dw.reshape(weight.shape).to(weight.dtype), *(t.view(x.shape) for t in y)


def _forward(
    x: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float, use_triton: bool, out_dtype: torch.dtype
) -> torch.Tensor:
    """y in out_dtype: the Triton kernel (rounding once on its store) or the exact reference."""
    if use_triton:
        return _triton_forward(x, weight, grid_min, grid_max, out_dtype)
    return rbf_grid_linear_reference(x, weight, grid_min, grid_max).to(out_dtype).contiguous()


def _backward_kernel(
    x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, grid_min: float, grid_max: float, use_triton: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx in x's dtype, dw in the weight's dtype) for the output gradient dy (any float dtype)."""
    dx, dw = (_triton_backward if use_triton else _torch_backward)(x, weight, dy, grid_min, grid_max)
    return dx.contiguous(), dw.contiguous()


def backward_and_output(
    x: torch.Tensor,
    weight: torch.Tensor,
    dy: torch.Tensor,
    grid_min: float,
    grid_max: float,
    use_triton: bool,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, y): the backward's gradients and the forward's output y in out_dtype, for a caller that needs y in
    its backward instead of saving it. The Triton backward writes y from the pass that computes dx and dw; the
    torch path forms y from the basis its gradients use (the reference's values)."""
    if use_triton:
        return _triton_backward(x, weight, dy, grid_min, grid_max, out_dtype)
    dx, dw, y = _torch_backward(x, weight, dy, grid_min, grid_max, out_dtype)
    return dx.contiguous(), dw.contiguous(), y


# The operator as torch custom ops (forward, backward), so that torch.compile keeps it in its graph as one opaque
# call. Both save only x and the weight; the backward recomputes the basis.


@torch.library.custom_op("lkat_lens::rbf_grid_linear", mutates_args=())
def _rbf_op(
    x: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float, use_triton: bool, out_dtype: torch.dtype
) -> torch.Tensor:
    """The forward (_forward) as a custom op."""
    return _forward(x, weight, grid_min, grid_max, use_triton, out_dtype)


@_rbf_op.register_fake
def _rbf_fake(x, weight, grid_min, grid_max, use_triton, out_dtype):
    return x.new_empty(x.shape, dtype=out_dtype)


@torch.library.custom_op("lkat_lens::rbf_grid_linear_backward", mutates_args=())
def _rbf_backward_op(
    x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, grid_min: float, grid_max: float, use_triton: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward (_backward_kernel) as a custom op."""
    return _backward_kernel(x, weight, dy, grid_min, grid_max, use_triton)


@_rbf_backward_op.register_fake
def _rbf_backward_fake(x, weight, dy, grid_min, grid_max, use_triton):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _rbf_setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    x, weight, grid_min, grid_max, use_triton, _ = inputs
    ctx.save_for_backward(x, weight)
    ctx.args = (grid_min, grid_max, use_triton)


def _rbf_backward(ctx: Any, dy: torch.Tensor, kernel) -> tuple[torch.Tensor | None, ...]:
    dx, dw = kernel(*ctx.saved_tensors, dy, *ctx.args)
    return (dx if ctx.needs_input_grad[0] else None), (dw if ctx.needs_input_grad[1] else None), None, None, None, None


_rbf = differentiable(
    Kernel(_rbf_op, _forward), Kernel(_rbf_backward_op, _backward_kernel), _rbf_backward, _rbf_setup_context
)


def triton_supports(x: torch.Tensor) -> bool:
    """Whether backend "auto" runs the Triton kernel for this input (CUDA, triton present, fp32/bf16/fp16)."""
    return rbf_triton is not None and x.is_cuda and x.dtype in TRITON_DTYPES


def rbf_grid_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    grid_min: float,
    grid_max: float,
    *,
    backend: str = "auto",
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """y = sum_g w_g phi_g(x) elementwise, differentiable in x and weight, without storing the basis.

    backend "torch": the exact reference forward and an explicit torch backward; "triton": the fused
    Triton kernels (on CPU tensors through the Triton interpreter); "auto": triton where supported.
    out_dtype (x's dtype unless given): the dtype y is written in, e.g. the autocast dtype of the matmul that
    reads y (the same values as casting y afterwards, without the extra copy).
    """
    use_triton = uses_triton(x, weight, grid_min, grid_max, backend)
    return _rbf(x, weight, float(grid_min), float(grid_max), use_triton, out_dtype or x.dtype)


def uses_triton(x: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float, backend: str) -> bool:
    """Whether `backend` runs the Triton kernel for these operands; one clear error for a backend, grid or weight
    they cannot take."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {BACKENDS}")
    _is_shared(x, weight)  # validates the weight's shape against x
    check_grid(grid_min, grid_max, weight.shape[-1])
    if backend == "triton" and (rbf_triton is None or x.dtype not in TRITON_DTYPES):
        raise ValueError(f"the triton backend needs triton and x in {TRITON_DTYPES}, got {x.dtype}")
    return backend == "triton" or (backend == "auto" and triton_supports(x))
