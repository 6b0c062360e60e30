"""The paper's RBF grid-linear kernel design (its Algorithms 1-2), written here as the benchmark baseline.

Shared weights, x flattened. Forward: each program loads a block of x and loops over the G centers with
one exponential per center, writing y in fp32. Backward: dy is upcast to fp32 first; each program
recomputes the basis, writes dx in fp32 and adds its block sum for every grid point to dw with one
atomic (G atomics per program); y and dx are then cast to x's dtype. This is a baseline for
benchmarks/bench_rbf.py, not a product path (lkat_lens.kernels.rbf is).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

_BWD_BLOCK = 1024
_FWD_TILES = ((256, 2), (512, 4), (1024, 4), (2048, 8), (4096, 8))  # (BLOCK, warps): the paper's 256..4096


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in _FWD_TILES], key=["G"])
@triton.jit
def _paper_fwd_kernel(x_ptr, w_ptr, y_ptr, n, grid_min, h_inv, h, G: tl.constexpr, BLOCK: tl.constexpr):
    """y = sum_g w_g exp(-((x - c_g) / h)^2), one exponential per center, fp32 out."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for g in range(G):
        t = (x - (grid_min + g * h)) * h_inv
        acc += tl.load(w_ptr + g) * tl.exp(-t * t)
    tl.store(y_ptr + offs, acc, mask=mask)


@triton.jit
def _paper_bwd_kernel(
    x_ptr, w_ptr, dy_ptr, dx_ptr, dw_ptr, n, grid_min, h_inv, h, G: tl.constexpr, BLOCK: tl.constexpr
):
    """dx = dy sum_g w_g phi_g (-2 t / h) in fp32; dw_g += block sum of dy phi_g by one atomic per center."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0)
    jac = tl.zeros((BLOCK,), dtype=tl.float32)
    for g in range(G):
        t = (x - (grid_min + g * h)) * h_inv
        phi = tl.exp(-t * t)
        jac += tl.load(w_ptr + g) * phi * (-2.0 * t * h_inv)
        tl.atomic_add(dw_ptr + g, tl.sum(dy * phi, axis=0))
    tl.store(dx_ptr + offs, dy * jac, mask=mask)


def _constants(grid_min: float, grid_max: float, G: int) -> tuple[float, float, float]:
    """(grid_min, 1/h, h)."""
    h = (grid_max - grid_min) / (G - 1)
    return grid_min, 1.0 / h, h


class _PaperRBF(torch.autograd.Function):
    """The paper's op: saves x and the weight."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float) -> torch.Tensor:
        w = weight.detach().reshape(-1).float().contiguous()
        x_flat = x.reshape(-1).contiguous()
        consts = _constants(grid_min, grid_max, w.numel())
        y = torch.empty(x_flat.shape, device=x.device, dtype=torch.float32)
        n = x_flat.numel()
        _paper_fwd_kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x_flat, w, y, n, *consts, G=w.numel())
        ctx.save_for_backward(x_flat, w)
        ctx.meta = (consts, x.shape, x.dtype, weight.shape, weight.dtype)
        return y.view(x.shape).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x_flat, w = ctx.saved_tensors
        consts, x_shape, x_dtype, w_shape, w_dtype = ctx.meta
        dy32 = dy.reshape(-1).contiguous().float()
        dx = torch.empty(x_flat.shape, device=x_flat.device, dtype=torch.float32)
        dw = torch.zeros_like(w)
        n = x_flat.numel()
        grid = (triton.cdiv(n, _BWD_BLOCK),)
        _paper_bwd_kernel[grid](x_flat, w, dy32, dx, dw, n, *consts, G=w.numel(), BLOCK=_BWD_BLOCK, num_warps=4)
        return dx.view(x_shape).to(x_dtype), dw.view(w_shape).to(w_dtype), None, None


def paper_rbf_grid_linear(x: torch.Tensor, weight: torch.Tensor, grid_min: float, grid_max: float) -> torch.Tensor:
    """y = sum_g w_g phi_g(x) for shared weights [G] or [1, G], by the paper's kernel design (CUDA only)."""
    if weight.numel() != weight.shape[-1]:
        raise ValueError("the paper's kernel takes shared weights [G] or [1, G] only")
    return _PaperRBF.apply(x, weight, float(grid_min), float(grid_max))
