"""GLA's forget gate from its low-rank code as one Triton kernel each way: gk = logsigmoid(code @ W^T + b) / n.

For the gate's code [N, R] (any strides: it is a column slice of the stacked projection output, N = batch x tokens),
the second gate Linear's weight [K, R] and bias [K], and the normaliser n:
    gk = logsigmoid(code @ W^T + b) / n   [N, K], in fp32,
the products and the log-sigmoid computed in fp32, each dot product on the tensor cores as three TF32 products of the
operands' high and low parts (Triton's tf32x3, DOT_PRECISION: within fp32 rounding of IEEE products, which Triton
runs on the FMA units). A 16-bit code (bf16 under autocast, as LKAT trains) is exact in TF32, so the products with
the code take two TF32 products, against the other operand's high and low parts (`_code_dot`): the same terms, since
tf32x3's third, of the code's low part, is zero. The backward recomputes the logits from the code (only the code and
the parameters are saved, never a [N, K] tensor) and, in one pass over the gate's gradient dgk, writes the code's
gradient and per-program partial sums of the weight's gradient (formed transposed, code^T dx, so that the [rows, K]
tile dx is never transposed) and the bias's, summed on the host in a fixed order (deterministic, no atomics).

Why: as modules the gate is a GEMM writing the fp32 logits, which the log-sigmoid's backward reads (a [N, K] fp32
tensor saved per layer), a pointwise kernel for the log-sigmoid and, in the backward, two passes over the logits'
gradient and the two GEMMs. Here only the code is saved: LKAT-T's compiled training step needs 20.7 instead of 22.5
MiB per image, launches 851 instead of 958 kernels and takes 14.72 instead of 15.08 ms of kernels; the gate's forward
+ backward alone takes 0.082 / 0.134 / 0.239 ms at LKAT-T / S / B's shapes against 0.099 / 0.240 / 0.455 ms for the
compiled modules (H100, benchmarks/README.md). The model takes this path on CUDA, eager and under torch.compile
(models.attention.VisionGLA.forget_gate). With TRITON_INTERPRET=1 in the environment before triton is first imported
the kernels run on CPU tensors with fixed tiles.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .autograd_ops import ANY_STRIDES, Kernel, differentiable
from .host_math import cdiv, next_power_of_2
from .tuned import TunedKernel, kernel_table, programs_key, written_through

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
CODE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_RANK = 64
# Triton's input_precision of the kernels' dot products (see the module docstring); bench_gla_gate.py times "ieee" too
DOT_PRECISION = "tf32x3"
_INTERP_TILES = {"BR": 16, "BK": 32}
# Rows per backward program: its weight and bias partials are summed over them before one store each, so the row tile
# is not tuned (every configuration must write the same partials).
_BWD_ROWS = 128


def gla_gate_reference(code: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, normalizer: float) -> torch.Tensor:
    """The exact torch form: fp32 (fp64 for fp64 operands) logits and log-sigmoid, divided by the normaliser."""
    dtype = torch.float64 if torch.float64 in (code.dtype, weight.dtype) else torch.float32
    logits = torch.nn.functional.linear(code.to(dtype), weight.to(dtype), bias.to(dtype))
    return torch.nn.functional.logsigmoid(logits) / normalizer


@triton.jit
def _tile(ptr, s0, s1, r, c, rows, cols):
    """Rows r and columns c of a 2-D tensor with strides (s0, s1) as fp32, zero outside [rows, cols]."""
    mask = (r < rows)[:, None] & (c < cols)[None, :]
    return tl.load(ptr + r[:, None].to(tl.int64) * s0 + c[None, :] * s1, mask=mask, other=0.0).to(tl.float32), mask


@triton.jit
def _log1p(e):
    """log(1 + e) for e >= 0, exact to fp32 rounding for small e (log(u) * e / (u - 1), u = 1 + e rounded)."""
    u = 1.0 + e
    exact = u == 1.0
    return tl.where(exact, e, tl.log(u) * (e / tl.where(exact, 1.0, u - 1.0)))


@triton.jit
def _tf32_high(x):
    """x with its mantissa cut to TF32's 10 bits: x - _tf32_high(x) is exact in fp32 and is x's low part."""
    return (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def _code_dot(a, b, DOT: tl.constexpr, EXACT_A: tl.constexpr):
    """a @ b with a from the code. EXACT_A (a 16-bit code, whose values TF32 holds exactly): two TF32 products, of a
    with b's high and low parts, the same terms as tf32x3's three, whose third (a's low part) is zero here."""
    if EXACT_A:
        high = _tf32_high(b)
        out = tl.dot(a, b - high, tl.dot(a, high, input_precision="tf32"), input_precision="tf32")
    else:
        out = tl.dot(a, b, input_precision=DOT)
    return out


@triton.jit
def _gla_gate_fwd_kernel(code_ptr, w_ptr, b_ptr, gk_ptr, sc0, sc1, sw0, sw1, rows, K, R, inv_norm, programs,
                         RB: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, DOT: tl.constexpr,
                         EXACT_CODE: tl.constexpr):  # fmt: skip
    """gk (contiguous [N, K], fp32) on a tile of BR rows and BK columns; `programs` is only the autotuning key."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    k = tl.program_id(1) * BK + tl.arange(0, BK)
    j = tl.arange(0, RB)
    code = _tile(code_ptr, sc0, sc1, r, j, rows, R)[0]
    w_t = _tile(w_ptr, sw1, sw0, j, k, R, K)[0]  # [RB, BK]: W transposed
    x = _code_dot(code, w_t, DOT, EXACT_CODE) + tl.load(b_ptr + k, mask=k < K, other=0.0)[None, :]
    # in fp32: torch.compile passes a Python float as fp64 (tuned.py)
    gate = (tl.minimum(x, 0.0) - _log1p(tl.exp(-tl.abs(x)))) * tl.cast(inv_norm, tl.float32)
    mask = (r < rows)[:, None] & (k < K)[None, :]
    tl.store(gk_ptr + r[:, None].to(tl.int64) * K + k[None, :], gate, mask=mask)


@triton.jit
def _gla_gate_bwd_kernel(code_ptr, w_ptr, b_ptr, dgk_ptr, dcode_ptr, part_ptr, sc0, sc1, sw0, sw1, sd0, sd1, sdc0,
                         sdc1, dcode_offset, rows, K, R, inv_norm, programs, RB: tl.constexpr, BR: tl.constexpr,
                         BK: tl.constexpr, DOT: tl.constexpr, EXACT_CODE: tl.constexpr):  # fmt: skip
    """The code's gradient ([N, R] from dcode_offset, strides sdc*) of BR rows, walking K in tiles of BK, and this
    program's partial sums of the weight's gradient, transposed, and the bias's gradient: part_ptr [launched programs,
    R + 1, K], row R the bias's (each program's block contiguous); `programs` is only the autotuning key."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    j = tl.arange(0, RB)
    code, code_mask = _tile(code_ptr, sc0, sc1, r, j, rows, R)
    code_t = tl.trans(code)  # [RB, BR]: the weight's gradient is formed transposed, so dx is never transposed
    part = part_ptr + tl.program_id(0).to(tl.int64) * (R + 1) * K
    dcode = tl.zeros((BR, RB), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        w = _tile(w_ptr, sw0, sw1, k, j, K, R)[0]  # [BK, RB]
        x = _code_dot(code, tl.trans(w), DOT, EXACT_CODE) + tl.load(b_ptr + k, mask=k < K, other=0.0)[None, :]
        dgk = _tile(dgk_ptr, sd0, sd1, r, k, rows, K)[0]  # zero on rows past N: those add nothing below
        # in fp32: torch.compile passes a Python float as fp64 (tuned.py)
        dx = dgk * tl.sigmoid(-x) * tl.cast(inv_norm, tl.float32)
        dcode += tl.dot(dx, w, input_precision=DOT)
        dw_t = _code_dot(code_t, dx, DOT, EXACT_CODE)  # [RB, BK]
        tl.store(part + j[:, None] * K + k[None, :], dw_t, mask=(j < R)[:, None] & (k < K)[None, :])
        tl.store(part + R * K + k, tl.sum(dx, axis=0), mask=k < K)
    offs = r[:, None].to(tl.int64) * sdc0 + j[None, :] * sdc1
    tl.store(dcode_ptr + dcode_offset + offs, dcode.to(dcode_ptr.dtype.element_ty), mask=code_mask)


_KERNELS = {"forward": _gla_gate_fwd_kernel, "backward": _gla_gate_bwd_kernel}
# (row tile, column tile, warps) the forward's autotuner tries, and (column tile, warps) the backward's
_FWD_CONFIGS = ((32, 64, 4), (64, 64, 4), (64, 128, 4), (128, 64, 4), (128, 128, 8))
_BWD_CONFIGS = ((32, 4), (64, 4), (64, 8), (128, 8))


@kernel_table(_KERNELS)
def _autotuned(kernel_name: str) -> TunedKernel:
    """The CUDA kernel autotuned over its tiles and warps, keyed on the rank, the width, the rows and the dot
    products' precision."""
    if kernel_name == "forward":
        configs = [triton.Config({"BR": br, "BK": bk}, num_warps=w) for br, bk, w in _FWD_CONFIGS]
    else:
        configs = [triton.Config({"BK": bk}, num_warps=w) for bk, w in _BWD_CONFIGS]
    return TunedKernel(triton.autotune(configs=configs, key=["R", "K", "programs", "DOT"])(_KERNELS[kernel_name]))


def _launch(kernel_name: str, grid, *args, **meta) -> None:
    """Launch over grid(meta) programs: the interpreter with _INTERP_TILES, CUDA autotuned."""
    if INTERPRET:
        tiles = {name: value for name, value in _INTERP_TILES.items() if name not in meta}
        _KERNELS[kernel_name][grid({**meta, **tiles})](*args, **meta, **tiles)
    else:
        _autotuned(kernel_name)[grid](*args, **meta)


def gla_gate_fwd(code: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, normalizer: float) -> torch.Tensor:
    """gk [N, K] (contiguous, fp32) of code [N, R]."""
    (N, R), K = code.shape, weight.shape[0]
    gk = torch.empty(N, K, dtype=torch.float32, device=code.device)
    if N and K:
        args = (code, weight, bias, gk, *code.stride(), *weight.stride(), N, K, R, 1.0 / normalizer, programs_key(N))
        grid = lambda m: (cdiv(N, m["BR"]), cdiv(K, m["BK"]))  # noqa: E731
        _launch("forward", grid, *args, **_products(code, R))
    return gk


def gla_gate_bwd(
    code: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    dgk: torch.Tensor,
    normalizer: float,
    dcode: torch.Tensor | None = None,
    dcode_into: tuple[torch.Tensor, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the code's gradient in its dtype, d_affine) for the gate's gradient dgk: d_affine [R + 1, K] in fp32 holds the
    weight's gradient transposed in its first R rows and the bias's in the last. The code's gradient is written into
    `dcode` when given (an [N, R] tensor of any strides, such as a column slice of a wider gradient: pass that
    gradient and the slice's offset as dcode_into, tuned.written_through)."""
    (N, R), K = code.shape, weight.shape[0]
    if dcode is None:
        dcode = torch.empty(N, R, dtype=code.dtype, device=code.device)
    if not (N and K):
        return dcode.zero_(), torch.zeros(R + 1, K, dtype=torch.float32, device=code.device)
    programs = cdiv(N, _BWD_ROWS)
    part = torch.empty(programs, R + 1, K, dtype=torch.float32, device=code.device)
    target, offset = written_through(dcode, dcode_into)
    strides = (*code.stride(), *weight.stride(), *dgk.stride(), *dcode.stride(), offset)
    args = (code, weight, bias, dgk, target, part, *strides, N, K, R, 1.0 / normalizer, programs_key(N))
    _launch("backward", lambda m: (programs,), *args, BR=_BWD_ROWS, **_products(code, R))
    return dcode, part.sum(0)


def _products(code: torch.Tensor, rank: int) -> dict:
    """The kernels' dot-product arguments: the rank's tile, the precision and whether the code is exact in TF32."""
    exact = code.dtype in (torch.bfloat16, torch.float16) and DOT_PRECISION == "tf32x3"
    return {"RB": _rank_block(rank), "DOT": DOT_PRECISION, "EXACT_CODE": exact}


def _rank_block(rank: int) -> int:
    """The code's columns as a tile: a power of two, at least 16 (tl.dot's smallest operand)."""
    return max(16, next_power_of_2(rank))


# Both ops read the code through its strides (a column slice of the projection output), the backward dgk too.
@torch.library.custom_op("lkat_lens::gla_gate", mutates_args=(), tags=ANY_STRIDES)
def _gla_gate_op(code: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, normalizer: float) -> torch.Tensor:
    """The forward as a custom op (opaque to torch.compile)."""
    return gla_gate_fwd(code, weight, bias, normalizer)


@_gla_gate_op.register_fake
def _gla_gate_fake(code, weight, bias, normalizer) -> torch.Tensor:
    return code.new_empty(code.shape[0], weight.shape[0], dtype=torch.float32)


@torch.library.custom_op("lkat_lens::gla_gate_backward", mutates_args=(), tags=ANY_STRIDES)
def _gla_gate_backward_op(
    code: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dgk: torch.Tensor, normalizer: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward as a custom op: (d_code, d_affine)."""
    return gla_gate_bwd(code, weight, bias, dgk, normalizer)


@_gla_gate_backward_op.register_fake
def _gla_gate_backward_fake(code, weight, bias, dgk, normalizer):
    K, R = weight.shape
    return code.new_empty(code.shape), code.new_empty(R + 1, K, dtype=torch.float32)


def _setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    code, weight, bias, normalizer = inputs
    ctx.save_for_backward(code, weight, bias)
    ctx.normalizer = normalizer


def affine_grads(d_affine: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight's and the bias's gradients, in their dtypes, from gla_gate_bwd's d_affine."""
    R = weight.shape[1]
    return d_affine[:R].t().to(weight.dtype), d_affine[R].to(bias.dtype)


def _backward(ctx, dgk: torch.Tensor, kernel) -> tuple:
    code, weight, bias = ctx.saved_tensors
    dcode, d_affine = kernel(code, weight, bias, dgk, ctx.normalizer)
    return dcode, *affine_grads(d_affine, weight, bias), None


_gla_gate = differentiable(
    Kernel(_gla_gate_op, gla_gate_fwd), Kernel(_gla_gate_backward_op, gla_gate_bwd), _backward, _setup_context
)


def supports(code: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether the kernels take these operands: a code [..., R] in 16/32-bit floats, R at most MAX_RANK, an fp32
    weight [K, R] and bias [K], on CUDA (or under the interpreter)."""
    return (
        bias is not None
        and code.dim() >= 1
        and weight.dim() == 2
        and code.shape[-1] == weight.shape[1] <= MAX_RANK
        and bias.shape == weight.shape[:1]
        and code.dtype in CODE_DTYPES
        and weight.dtype == bias.dtype == torch.float32
        and (code.is_cuda or INTERPRET)
    )


def gla_gate(code: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, normalizer: float) -> torch.Tensor:
    """Differentiable logsigmoid(code @ weight^T + bias) / normalizer for code [..., R], weight [K, R] and bias [K]:
    [..., K] in fp32, contiguous. Gradients reach the code, the weight and the bias."""
    if not supports(code, weight, bias):
        raise ValueError(
            f"gla_gate needs a code [..., R] (R <= {MAX_RANK}) in {CODE_DTYPES} on CUDA (or the Triton interpreter) "
            f"and an fp32 weight [K, R] and bias [K]; got code {tuple(code.shape)} {code.dtype} on {code.device}, "
            f"weight {tuple(weight.shape)} {weight.dtype}, bias {None if bias is None else tuple(bias.shape)}"
        )
    lead = code.shape[:-1]
    return _gla_gate(code.reshape(-1, code.shape[-1]), weight, bias, float(normalizer)).view(*lead, weight.shape[0])
