"""GLA's core as one computation each way: from the stacked projection output to the gated, normalised heads.

VisionGLA projects its input once, y = [q | k | v | g | code] [B, T, P] (one GEMM with the stacked weights of q_proj,
k_proj, v_proj, g_proj and the gate's low-rank Linear; models.attention). The core takes y whole and runs the kernels
the pieces run one by one: q, k and v through their input paths (`gla_input`: short convolution, SiLU, q/k RMSNorm,
RoPE; all three in one launch each way), the forget gate from the code (`gla_gate`), the GLA itself by the short
kernels (`gla_short`) and the output path g_norm(o) * SiLU(g) (`gated_norm`), returning z [B, T, H, V]. It saves what
they save (y, q, k, v, gk, the segment states h, o). Its backward runs their backward kernels in reverse order, each
writing its piece's gradient straight into that piece's columns of one [B, T, P] gradient, which the projection's
backward GEMMs read as it is.

Why: with the pieces as separate ops, each returns its own gradient, and autograd (under torch.compile, inductor)
concatenates the five into the [rows, P] matrix, one kernel that reads and writes the whole of it in every layer:
`triton_poi_fused_cat_view` took 0.31-0.53 ms of LKAT-T's ~14.6 ms compiled training step and 1.24 ms of LKAT-B's
(H100, batch 128). With the core the step took 14.03 instead of 14.64 ms of kernels (LKAT-T; LKAT-S 26.83 / 27.40,
LKAT-B 58.14 / 59.64; benchmarks/README.md). The values are the pieces' own: the same kernels, the same operands
(q, k and v in one launch of the same programs: equal in fp32 up to how the compiler contracts them).
The backward holds the saved tensors until its last kernel (the pieces free each after their own): 0.5-2 MiB more
per image at the training step's peak.

Under torch.compile the core is no custom op: dynamo traces its autograd.Function (autograd_ops.traced), host code
and all, and records the Triton launches of the input path, the gate and the output path (six kernels) as user-defined
kernels, which inductor launches from its generated code (tuned.py says what such a kernel must not take; the gate's
and the code's gradients go into dy through dy itself, tuned.written_through). The custom op cost every call its
dispatch and its Python host code: LKAT-T compiled without CUDA graphs trained at 0.44x ViT-T's speed with it, 0.60x
traced (0.45x and 0.84x of ViT-T's queued throughput; H200, consecutive runs on one machine); a later run of the
traced core gave 0.45x (0.49x queued) beside a faster ViT-T process, LKAT-T's own speed unchanged
(benchmarks/README.md). Inductor compiles a user-defined kernel's configurations with their warps and stages alone and
drops Triton's register cap (`maxnreg`; torch 2.11 to 2.14: `config_to_dict` and the compile options carry neither),
and at LKAT-T's shape the short GLA kernels' fastest configurations are capped (three programs an SM instead of two):
traced, they took 1.024 / 3.267 ms a step forward / backward, as custom ops launched by our autotuner 0.698 / 2.765
(CUDA graphs, H200, torch 2.11). A custom op costs host time on every call, though, which CUDA graphs pay once, at
capture, and a step compiled without them pays each time: there the ops took LKAT-T's compiled inference from 5.2 to
6.9 ms a step (fastest steps, interleaved in one process; benchmarks/README.md). So `short_ops` (VisionGLA's
`cuda_graphs`, set by LKAT.set_backends(cuda_graphs=True) and by the trainer for the compile modes that replay CUDA
graphs) chooses the ops, and the short kernels are traced otherwise.

The model takes this op when all three paths around the GLA take their kernels, the GLA takes the short kernels and
no hook point between the pieces is hooked (VisionGLA.fuses_core); otherwise it runs the pieces. With TRITON_INTERPRET=1
in the environment before triton is first imported the kernels run on CPU tensors.
"""

from __future__ import annotations

import torch

from .autograd_ops import EagerGraphs, eager_graphs, traced
from .gated_norm import affine_grads as norm_affine_grads
from .gated_norm import gated_norm_bwd, gated_norm_fwd
from .gla_gate import affine_grads as gate_affine_grads
from .gla_gate import gla_gate_bwd, gla_gate_fwd
from .gla_input import gla_qkv_bwd, gla_qkv_fwd
from .gla_short import INTERPRET, SHORT_BACKWARD, SHORT_FORWARD


def _gate_columns(y: torch.Tensor, key_dim: int, value_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """y's column slices g and code, after q's, k's and v's columns (views; the q/k/v kernels read those from y)."""
    return y[..., 2 * key_dim + value_dim :].split([value_dim, y.shape[-1] - 2 * (key_dim + value_dim)], dim=-1)


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, T, D] as rows of heads [B * T, H, D / H] (a view)."""
    return x.unflatten(-1, (heads, -1)).flatten(0, 1)


def gla_core_fwd(
    y, conv_q, conv_k, conv_v, norm_q, norm_k, cos, sin, gate_weight, gate_bias, out_weight, out_bias,
    heads: int, scale: float, segment: int, eps: list[float], normalizer: float, short_ops: bool,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """(z [B, T, H, V] in y's dtype, then what the backward reads: q, k, v, gk, h, o). eps: q_norm's, k_norm's and
    g_norm's; short_ops: the short GLA as its custom op while torch.compile traces (gla_core)."""
    B, T, _ = y.shape
    yg, code = _gate_columns(y, conv_q.shape[0], conv_v.shape[0])
    q, k, v = gla_qkv_fwd(y, (conv_q, conv_k, conv_v), (norm_q, norm_k), cos, sin, heads, (eps[0], eps[1]))
    gk = gla_gate_fwd(code.flatten(0, 1), gate_weight, gate_bias, normalizer).view(B, T, heads, -1)
    o, h = (SHORT_FORWARD if short_ops else SHORT_FORWARD.function)(q, k, v, gk, scale, segment)
    z = gated_norm_fwd(o.flatten(0, 1), _heads(yg, heads), out_weight, out_bias, eps[2]).view(o.shape)
    return z, q, k, v, gk, h, o


def gla_core_bwd(
    y, conv_q, conv_k, conv_v, norm_q, norm_k, cos, sin, gate_weight, gate_bias, out_weight, out_bias,
    q, k, v, gk, h, o, dz, heads: int, scale: float, segment: int, eps: list[float], normalizer: float,
    short_ops: bool,
) -> tuple[torch.Tensor | None, ...]:  # fmt: skip
    """(dy [B, T, P] contiguous in y's dtype, the convolution weights' gradients stacked and v's apart where its shape
    differs (gla_qkv_bwd's d conv and d conv_v, the latter None otherwise), the q and k norm weights' stacked
    [2, K / H], the gate's d_affine [R + 1, K] (gla_gate_bwd) and the output norm's [2, V / H] (gated_norm_bwd)) for
    z's gradient dz. Stacked, each is one reduction of its partial sums."""
    dy = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    key_dim, value_dim = conv_q.shape[0], conv_v.shape[0]
    yg, code = _gate_columns(y, key_dim, value_dim)
    dyg, dcode = _gate_columns(dy, key_dim, value_dim)
    # the gate's and the code's gradients go into their columns of dy, written through dy (tuned.written_through)
    g_column, code_column = 2 * key_dim + value_dim, 2 * (key_dim + value_dim)
    do, _, d_out = gated_norm_bwd(o.flatten(0, 1), _heads(yg, heads), out_weight, out_bias,
                                  dz.reshape(-1, *dz.shape[2:]), eps[2], _heads(dyg, heads),
                                  (dy, g_column))  # fmt: skip
    short = SHORT_BACKWARD if short_ops else SHORT_BACKWARD.function
    dq, dk, dv, dgk = short(q, k, v, gk, h, do.view(o.shape), scale, segment)
    d_gate = gla_gate_bwd(code.flatten(0, 1), gate_weight, gate_bias, dgk.flatten(0, 1).flatten(1), normalizer,
                          dcode.flatten(0, 1), (dy, code_column))[1]  # fmt: skip
    d_conv, d_conv_v, d_norm = gla_qkv_bwd(
        y, (conv_q, conv_k, conv_v), (norm_q, norm_k), cos, sin, (dq, dk, dv), heads, (eps[0], eps[1]), dy
    )
    return dy, d_conv, d_conv_v, d_norm, d_gate, d_out


__all__ = ["INTERPRET", "core_graphs", "gla_core", "gla_core_bwd", "gla_core_fwd"]


_TENSORS = 12  # the forward's tensor inputs; its scalar arguments follow


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)  # no zero gradients for the six saved outputs (48 fills an eager LKAT-T step)
    ctx.save_for_backward(*inputs[:_TENSORS], *output[1:])
    ctx.args = inputs[_TENSORS:]


def _backward(ctx, dz: torch.Tensor, *_saved_grads, kernel) -> tuple:
    saved = ctx.saved_tensors
    dy, d_conv, d_conv_v, d_norm, d_gate, d_out = kernel(*saved, dz, *ctx.args)
    d_conv_q, d_conv_k, *d_conv_vs = d_conv.unbind(0)
    d_norm_q, d_norm_k = d_norm.unbind(0)
    gate_weight, gate_bias, out_weight, out_bias = saved[8:_TENSORS]
    gate = gate_affine_grads(d_gate, gate_weight, gate_bias)
    out_norm = norm_affine_grads(d_out, out_weight, out_bias)
    d_conv_v = d_conv_vs[0] if d_conv_vs else d_conv_v
    return (dy, d_conv_q, d_conv_k, d_conv_v, d_norm_q, d_norm_k, None, None, *gate, *out_norm,
            *[None] * len(ctx.args))  # fmt: skip


_gla_core = traced("gla_core", gla_core_fwd, gla_core_bwd, _backward, _setup_context)


def core_graphs() -> EagerGraphs:
    """A layer's empty CUDA-graph captures of the core (gla_core's `graphs`): y moves from call to call, and in the
    backward dz (after the 12 tensor inputs and the 6 saved outputs); the weights, the tables and what the forward
    saved stay in place."""
    return eager_graphs(gla_core_fwd, gla_core_bwd, moving=0, dz=_TENSORS + 6)


def gla_core(
    y: torch.Tensor,
    convs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    norms: tuple[torch.Tensor, torch.Tensor],
    rotary: tuple[torch.Tensor, torch.Tensor],
    gate: tuple[torch.Tensor, torch.Tensor],
    out_norm: tuple[torch.Tensor, torch.Tensor],
    *,
    heads: int,
    scale: float,
    segment: int,
    eps: tuple[float, float, float],
    normalizer: float,
    short_ops: bool = False,
    graphs: EagerGraphs | None = None,
) -> torch.Tensor:
    """Differentiable GLA core z [B, T, H, V] (y's dtype) of the stacked projection output y [B, T, P]: convs are the
    q, k, v short convolutions' weights [D, 1, TAPS], norms the q and k RMSNorm weights [K / H], rotary the RoPE tables
    cos, sin [T, K / H], gate the forget gate's second Linear (weight [K, R], bias [K]), out_norm g_norm's weight and
    bias [V / H]; segment is gla_short's, eps q_norm's, k_norm's and g_norm's, normalizer gate_logit_normalizer.
    short_ops: under torch.compile, the short GLA's forward and backward as one custom op each instead of traced
    kernels (for CUDA graphs: the module docstring says why). graphs (core_graphs(), one per layer): on CUDA outside
    torch.compile, the forward and the backward replayed as CUDA graphs once captured (kernels/graphed.py).
    Gradients reach y and every weight (not the rotary tables). Beyond y's shape and device, the caller checks that
    the pieces' kernels take their operands (VisionGLA.fuses_core)."""
    width = 2 * (convs[0].shape[0] + convs[2].shape[0]) + gate[0].shape[1]
    if y.dim() != 3 or y.shape[-1] != width or not (y.is_cuda or INTERPRET):
        raise ValueError(
            f"gla_core needs y [B, T, 2 K + 2 V + R] = [B, T, {width}] on CUDA (or the Triton interpreter) for these "
            f"weights; got {tuple(y.shape)} on {y.device}"
        )
    y_eps = [float(e) for e in eps]
    args = (heads, float(scale), int(segment), y_eps, float(normalizer), bool(short_ops))
    return _gla_core(y, *convs, *norms, *rotary, *gate, *out_norm, *args, graphs=graphs)[0]
