"""Token mixers: vision Gated Linear Attention (LKAT) and multi-head self-attention (rbfKAT).

Every layer's attention pattern is the hook point `hook_pattern` [B,H,T,T]. With no hook attached the fused
kernels run (GLA, SDPA) and no pattern is built; once hooked, the pattern is materialised in fp32, passed
through the hook point and used as o = pattern @ v, so hooks read, replace or edit it and gradients reach it.
GLA's pattern is its exact implicit attention (causal, signed, rows not normalised; fp64 for fp64 inputs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import RmsNorm
from torch import nn

from lkat_lens.kernels import gla_short
from lkat_lens.kernels.dtypes import autocast_dtype, compute_dtype
from lkat_lens.kernels.gated_norm import gated_norm
from lkat_lens.kernels.gated_norm import supports as fused_output_supports
from lkat_lens.kernels.gla import gated_linear_attention, implicit_attention, kernel_path
from lkat_lens.kernels.gla_core import core_graphs, gla_core
from lkat_lens.kernels.gla_gate import gla_gate
from lkat_lens.kernels.gla_gate import supports as fused_gate_supports
from lkat_lens.kernels.gla_input import gla_input
from lkat_lens.kernels.gla_input import supports as fused_input_supports
from lkat_lens.kernels.log_gate import log_gate

from .hooks import HookPoint, is_hooked
from .rope import make_rope

INPUT_MODES = ("auto", "fused", "torch")
# the paths around the GLA that take INPUT_MODES: their set_backends keyword -> their VisionGLA attribute
PATH_MODES = {"gla_input": "input_mode", "gla_output": "output_mode", "gla_gate": "gate_mode", "gla_core": "core_mode"}


def check_input_mode(mode: str, name: str = "gla_input") -> None:
    """Raise unless `mode` is one of INPUT_MODES (the modes of the paths in PATH_MODES: GLA's input path, its output
    path, its forget gate and its core, all of them with the GLA as one op)."""
    if mode not in INPUT_MODES:
        raise ValueError(f"{name} must be one of {INPUT_MODES} (VisionGLA.{PATH_MODES[name]}), got {mode!r}")


def _hooked(*modules: nn.Module) -> bool:
    """Whether a forward hook or pre-hook sits on any of the modules."""
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def _takes_kernel(mode: str, x: torch.Tensor) -> bool:
    """Whether a path in `mode` (INPUT_MODES) runs its fused kernel for x: "fused" always, "auto" on CUDA."""
    return mode == "fused" or (mode == "auto" and x.is_cuda)


class ShortConvolution(nn.Conv1d):
    """Depthwise causal Conv1d over tokens followed by SiLU (fla's ShortConvolution parameters). On CUDA VisionGLA
    usually reads only its weight, for the fused input kernel (`VisionGLA.inputs`).

    Eager, it runs as Conv1d. While torch.compile traces it, it is the same sum written as `taps` shifted
    multiply-adds in the [B, T, D] layout (`shifted_taps`), which inductor fuses with the SiLU and what follows
    (the q/k RMSNorm, RoPE) instead of transposing for a depthwise convolution kernel and back.
    """

    def __init__(self, dim: int, kernel_size: int = 4) -> None:
        super().__init__(dim, dim, kernel_size, groups=dim, padding=kernel_size - 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, T, D] -> [B, T, D]."""
        if torch.compiler.is_compiling():
            return self.shifted_taps(x)
        y = super().forward(x.transpose(1, 2))[..., : x.shape[1]]
        return F.silu(y.transpose(1, 2))

    def shifted_taps(self, x: torch.Tensor) -> torch.Tensor:
        """SiLU of the causal convolution y_t = sum_j w_j x_{t-K+1+j} as K shifted multiply-adds, accumulated in fp32
        (fp64 for fp64 x), returned in the dtype Conv1d returns (the autocast dtype under autocast)."""
        taps, length, compute = self.kernel_size[0], x.shape[1], compute_dtype(x)
        padded = F.pad(x, (0, 0, taps - 1, 0)).to(compute)
        weight = self.weight[:, 0].to(compute)  # [D, K]
        y = sum(padded[:, j : j + length] * weight[:, j] for j in range(taps))
        return F.silu(y).to(autocast_dtype(x))


def softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, hook_pattern: HookPoint, dropout: float = 0.0
) -> torch.Tensor:
    """Softmax attention [B,H,T,dv] of heads-first q, k, v; with `hook_pattern` hooked, o = hook_pattern(P) @ v."""
    if not is_hooked(hook_pattern):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scale)
    pattern = hook_pattern(torch.softmax((q @ k.transpose(-1, -2)).float() * scale, dim=-1))
    return F.dropout(pattern.to(v.dtype), dropout, training=dropout > 0) @ v


class VisionGLA(nn.Module):
    """Gated Linear Attention for vision tokens: short convs, QK RMSNorm, 2D RoPE on patches, output gate.

    Parameter names follow fla's GatedLinearAttention as the reference uses it: q/k (and the forget gate) have
    key_dim = dim * expand_k channels, v and the output gate value_dim = dim * expand_v; `use_short_conv` adds
    the depthwise causal convs (`conv_size` taps) on q, k and v; `rope_mode` picks the reference's RoPE layout.

    `input_mode` (INPUT_MODES) is how q, k and v go from their projections to the GLA: "torch" runs the modules
    (q_conv1d, q_norm, rotary, ...); "fused" runs each of q, k, v through one kernel (`kernels.gla_input`: the
    same computation in fp32, stored once); "auto" is "fused" on CUDA and "torch" elsewhere. While a forward
    (pre-)hook sits on one of those modules, the modules run, whatever the mode, so that the hook fires.
    `output_mode` (the same modes) is how the output path g_norm(o) * SiLU(g) runs: "fused" is one kernel each way
    (`kernels.gated_norm`, eager and under torch.compile), "auto" (the default) is "fused" on CUDA and "torch"
    elsewhere; while a hook sits on g_norm it is the modules' form. `gate_mode` (the same modes) is how the forget
    gate logsigmoid(gk_proj[1](code)) / gate_logit_normalizer runs from its low-rank code: "fused" is one kernel each
    way (`kernels.gla_gate`, eager and under torch.compile), "auto" (the default) "fused" on CUDA; while a hook sits on
    gk_proj[1] it is the module's form. `core_mode` (the same modes) is whether the whole core, from the stacked
    projection output to the gated heads, runs as one op each way (`kernels.gla_core`: the pieces' kernels, q, k and v
    in one launch, the backward writing the pieces' gradients into one matrix): with "fused" (or "auto" on CUDA) it
    does whenever the three paths take their kernels, the GLA takes the short kernels (kernels.gla.kernel_path) and no
    hook point between the pieces (hook_q, hook_k, hook_v, hook_gk, hook_pattern) is hooked (`fuses_core`).
    `cuda_graphs` (False by default; LKAT.set_backends) says the model will run compiled as CUDA graphs: the core then
    keeps the short GLA as custom ops that our autotuner launches, with their register caps, instead of traced kernels
    (`kernels.gla_core` says why); it changes nothing eagerly. `eager_graphs` (False by default; LKAT.set_backends):
    on CUDA outside torch.compile the core's forward and backward replay as CUDA graphs from an input shape's second
    call on (`kernels.graphed`: one host call a layer each way instead of some fifty host ops; the layer's graphs hold
    their activations between calls).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        grid: tuple[int, int],
        *,
        expand_k: float = 1.0,
        expand_v: float = 1.0,
        use_short_conv: bool = True,
        conv_size: int = 4,
        gate_low_rank_dim: int = 16,
        gate_logit_normalizer: float = 16.0,
        rope_mode: str = "2dv1",
        rope_theta: float = 10000.0,
        qk_norm_eps: float = 1e-6,
        mode: str = "auto",
    ) -> None:
        super().__init__()
        key_dim, value_dim = int(dim * expand_k), int(dim * expand_v)
        if key_dim % num_heads or value_dim % num_heads:
            raise ValueError(
                f"key dim {key_dim} and value dim {value_dim} (dim {dim} x expand_k {expand_k} / expand_v "
                f"{expand_v}) must be divisible by num_heads {num_heads}"
            )
        self.num_heads, self.head_dim, self.head_v_dim = num_heads, key_dim // num_heads, value_dim // num_heads
        self.scale = self.head_dim**-0.5  # the query scale; a plain attribute, not a property (see hooks.is_hooked)
        self.gate_logit_normalizer, self.mode = gate_logit_normalizer, mode
        self.input_mode, self.output_mode, self.gate_mode, self.core_mode = "auto", "auto", "auto", "auto"
        self.cuda_graphs, self.eager_graphs = False, False
        self._graphs = core_graphs()  # the core's CUDA-graph captures (eager_graphs)
        self.q_proj = nn.Linear(dim, key_dim, bias=False)
        self.k_proj = nn.Linear(dim, key_dim, bias=False)
        self.v_proj = nn.Linear(dim, value_dim, bias=False)
        self.g_proj = nn.Linear(dim, value_dim, bias=False)
        convs = (key_dim, key_dim, value_dim) if use_short_conv else (None, None, None)
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (
            ShortConvolution(width, conv_size) if width else nn.Identity() for width in convs
        )
        self.gk_proj = nn.Sequential(
            nn.Linear(dim, gate_low_rank_dim, bias=False), nn.Linear(gate_low_rank_dim, key_dim)
        )
        self.o_proj = nn.Linear(value_dim, dim, bias=False)
        self.q_norm = RmsNorm(self.head_dim, eps=qk_norm_eps)
        self.k_norm = RmsNorm(self.head_dim, eps=qk_norm_eps)
        self.g_norm = nn.LayerNorm(self.head_v_dim)
        self.rotary = make_rope(rope_mode, grid, self.head_dim, rope_theta)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_gk, self.hook_pattern, self.hook_out = HookPoint(), HookPoint(), HookPoint()
        self.hook_z = HookPoint()  # per-head outputs [B,T,H,V] after g_norm and the output gate, before o_proj
        self._core_choices: dict[tuple, bool] = {}  # fuses_core's remembered answers

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor) -> torch.Tensor:
        """GLA output [B,T,H,V]; with hook_pattern hooked, hook_pattern(A) @ v for the implicit attention A."""
        if not is_hooked(self.hook_pattern):
            return gated_linear_attention(q, k, v, gk, scale=self.scale, mode=self.mode)
        pattern = self.hook_pattern(implicit_attention(q, k, gk, scale=self.scale))
        return (pattern @ v.transpose(1, 2).to(pattern.dtype)).transpose(1, 2).to(v.dtype)

    def projections(self) -> tuple[nn.Linear, ...]:
        """The Linears `project_stacked` stacks, in its order: q, k, v, the output gate g, the gate's low-rank code."""
        return (self.q_proj, self.k_proj, self.v_proj, self.g_proj, self.gk_proj[0])

    def project_stacked(self, x: torch.Tensor) -> torch.Tensor:
        """x through q_proj, k_proj, v_proj, g_proj and the gate's first (low-rank) Linear as one matmul with their
        stacked weights, [..., outputs] in `projections` order: the same products, but one GEMM and (under autocast)
        one cast of x instead of five, and x's gradient summed inside the GEMM's fp32 accumulation. The GEMM runs on
        x's rows as one 2-D matrix: the backward GEMMs read the pieces' gradients as one [rows, outputs] matrix (under
        torch.compile concatenated from the pieces, unless the core writes it whole). From a [B, T, outputs] output
        inductor padded the batch stride of that concatenation (LKAT-T's 784 columns: 201 x 784 -> 157,632), and
        viewing it as rows took a copy of it in every layer."""
        y = F.linear(x.flatten(0, -2), torch.cat([m.weight for m in self.projections()]))
        return y.unflatten(0, x.shape[:-1])

    def split_projection(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """project_stacked's output as the outputs of q_proj, k_proj, v_proj, g_proj and the gate's first Linear
        (views)."""
        return y.split([m.out_features for m in self.projections()], dim=-1)

    def input_modules(self) -> tuple[nn.Module, ...]:
        """The modules between the projections and the GLA (convolutions, q/k norms, RoPE)."""
        return (self.q_conv1d, self.k_conv1d, self.v_conv1d, self.q_norm, self.k_norm, self.rotary)

    def fuses_inputs(self, x: torch.Tensor) -> bool:
        """Whether q, k and v of this input (a projection output [B, T, D]) take the fused kernel (see input_mode)."""
        check_input_mode(self.input_mode)
        if not _takes_kernel(self.input_mode, x):
            return False
        convs = (self.q_conv1d, self.k_conv1d, self.v_conv1d)
        if _hooked(*self.input_modules()) or not all(isinstance(c, ShortConvolution) for c in convs):
            return False
        taps = max(c.weight.shape[-1] for c in convs)
        return fused_input_supports(x, self.num_heads, rope=True, taps=taps)

    def inputs(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k, v [B, T, H, *] from their projections: short convolutions and SiLU, q/k RMSNorm and RoPE."""
        if self.fuses_inputs(q):
            cos, sin = self.rotary.channel_tables(q.shape[1])
            q_norm, k_norm, H = self.q_norm, self.k_norm, self.num_heads
            return (
                gla_input(q, self.q_conv1d.weight, q_norm.weight, cos, sin, heads=H, eps=q_norm.eps),
                gla_input(k, self.k_conv1d.weight, k_norm.weight, cos, sin, heads=H, eps=k_norm.eps),
                gla_input(v, self.v_conv1d.weight, heads=H),
            )
        heads, v_heads = (self.num_heads, self.head_dim), (self.num_heads, self.head_v_dim)
        q = self.rotary(self.q_norm(self.q_conv1d(q).unflatten(-1, heads)))
        k = self.rotary(self.k_norm(self.k_conv1d(k).unflatten(-1, heads)))
        return q, k, self.v_conv1d(v).unflatten(-1, v_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project_stacked(x)
        z = self.core(y) if self.fuses_core(y) else self.pieces(y)
        return self.hook_out(self.o_proj(self.hook_z(z).flatten(-2)))

    def pieces(self, y: torch.Tensor) -> torch.Tensor:
        """The gated heads [B, T, H, V] of the stacked projection output y, piece by piece through the hook points."""
        heads, v_heads = (self.num_heads, self.head_dim), (self.num_heads, self.head_v_dim)
        q, k, v, g, gate_code = self.split_projection(y)
        q, k, v = self.inputs(q, k, v)
        v = self.hook_v(v)
        q, k = self.hook_q(q), self.hook_k(k)
        gk = self.forget_gate(gate_code).unflatten(-1, heads)
        o = self.mix(q, k, v, self.hook_gk(gk))
        return self.gated_norm(o, g.unflatten(-1, v_heads))

    def fuses_core(self, y: torch.Tensor) -> bool:
        """Whether the core of this stacked projection output takes the one op (see core_mode). Hooks are read on
        every call; the rest of the answer is remembered per input shape, dtype and device, the modes, the modules it
        reads and the gate's weight dtypes (eager only: checking anew took ~95 us a layer on the CPU machine, ~1 ms of
        host time an eager LKAT-T step)."""
        check_input_mode(self.core_mode, "gla_core")
        second, modules = self.gk_proj[1], self.input_modules()
        if any(is_hooked(p) for p in (self.hook_q, self.hook_k, self.hook_v, self.hook_gk, self.hook_pattern)) or (
            _hooked(*modules, second, self.g_norm)
        ):
            return False
        if torch.compiler.is_compiling():
            return self._core_takes(y)
        modes = (self.core_mode, self.input_mode, self.gate_mode, self.output_mode, self.mode)
        weights = (second.weight.dtype, None if second.bias is None else second.bias.dtype)
        # the modules themselves, not their ids: a key holds them, so a replaced module's id cannot come back
        key = (y.shape, y.dtype, y.device, modes, weights, *modules, second, self.g_norm)
        choice = self._core_choices.get(key)
        if choice is None:
            if len(self._core_choices) >= 64:
                self._core_choices.clear()
            choice = self._core_choices[key] = self._core_takes(y)
        return choice

    def _core_takes(self, y: torch.Tensor) -> bool:
        """fuses_core's answer for an unhooked layer: the modes, the GLA's path and the pieces' kernels' operands."""
        if not _takes_kernel(self.core_mode, y):
            return False
        K, V = self.head_dim, self.head_v_dim
        if kernel_path(self.mode, y.device, y.shape[1], y.dtype, K, V) != "short" or not gla_short.supports(K, V):
            return False
        q, _, _, g, code = self.split_projection(y.detach())
        g = g.unflatten(-1, (self.num_heads, V))
        norms = (self.q_norm.weight, self.k_norm.weight)
        return (
            all(w is not None for w in norms)
            and self.fuses_inputs(q)
            and self.fuses_gate(code)
            and self.fuses_output(g, g)
        )

    def core(self, y: torch.Tensor) -> torch.Tensor:
        """The gated heads [B, T, H, V] of the stacked projection output y by the one op (`kernels.gla_core`)."""
        cos, sin = self.rotary.channel_tables(y.shape[1])
        convs = (self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight)
        second, norms = self.gk_proj[1], (self.q_norm, self.k_norm, self.g_norm)
        return gla_core(
            y,
            convs,
            (norms[0].weight, norms[1].weight),
            (cos, sin),
            (second.weight, second.bias),
            (self.g_norm.weight, self.g_norm.bias),
            heads=self.num_heads,
            scale=self.scale,
            segment=gla_short.segment_length(y.shape[1]),
            eps=tuple(norm.eps for norm in norms),
            normalizer=self.gate_logit_normalizer,
            short_ops=self.cuda_graphs,
            graphs=None if torch.compiler.is_compiling() or not self.eager_graphs else self._graphs,
        )

    def fuses_gate(self, code: torch.Tensor) -> bool:
        """Whether the forget gate of this low-rank code takes the fused kernel (see gate_mode): not with a hook on
        gk_proj[1]."""
        check_input_mode(self.gate_mode, "gla_gate")
        second = self.gk_proj[1]
        if not _takes_kernel(self.gate_mode, code) or _hooked(second):
            return False
        return fused_gate_supports(code, second.weight, second.bias)

    def forget_gate(self, code: torch.Tensor) -> torch.Tensor:
        """GLA's log forget gate logsigmoid(gk_proj[1](code)) / gate_logit_normalizer [B, T, key_dim] in fp32 from the
        gate's low-rank code [B, T, gate_low_rank_dim]: the fused kernel (see fuses_gate), else the Linear in fp32
        (the logits of the small code are not taken in the autocast dtype) and `log_gate`."""
        second = self.gk_proj[1]
        if self.fuses_gate(code):
            return gla_gate(code, second.weight, second.bias, self.gate_logit_normalizer)
        with torch.autocast(code.device.type, enabled=False):
            logits = second(code.to(torch.promote_types(code.dtype, torch.float32)))
        return log_gate(logits, self.gate_logit_normalizer)

    def fuses_output(self, o: torch.Tensor, g: torch.Tensor) -> bool:
        """Whether g_norm(o) * SiLU(g) takes the fused kernel (see output_mode): not with a hook on g_norm nor for a
        g_norm without weight and bias."""
        check_input_mode(self.output_mode, "gla_output")
        if not _takes_kernel(self.output_mode, o):
            return False
        norm = self.g_norm
        if _hooked(norm) or norm.bias is None:
            return False
        return norm.weight is not None and fused_output_supports(o, g)

    def gated_norm(self, o: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """g_norm(o) * SiLU(g) per head [B,T,H,V]: the fused kernel (see fuses_output), else the modules. Under
        autocast with o in the autocast dtype, the modules' norm runs in that dtype (layer_norm keeps its statistics in
        fp32) instead of casting o to fp32 and the product back."""
        if self.fuses_output(o, g):
            norm = self.g_norm
            return gated_norm(o, g, norm.weight, norm.bias, norm.eps)
        device = o.device.type
        if torch.is_autocast_enabled(device) and o.dtype == torch.get_autocast_dtype(device):
            norm = self.g_norm
            with torch.autocast(device, enabled=False):
                weight, bias = norm.weight.to(o.dtype), norm.bias.to(o.dtype)
                normed = F.layer_norm(o, norm.normalized_shape, weight, bias, norm.eps)
            return normed * F.silu(g)
        return self.g_norm(o) * F.silu(g)


class SoftmaxAttention(nn.Module):
    """Multi-head softmax attention with QK RMSNorm and a subclass's position rotation `rotate` (its RoPE);
    `attn_drop` is dropout on the attention probabilities in training (the reference's SDPA dropout_p)."""

    def __init__(self, dim: int, num_heads: int, *, qkv_bias: bool, attn_drop: float) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads, self.head_dim, self.attn_drop = num_heads, dim // num_heads, attn_drop
        self.scale = self.head_dim**-0.5  # the query scale
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.q_norm = RmsNorm(self.head_dim, eps=1e-6)
        self.k_norm = RmsNorm(self.head_dim, eps=1e-6)
        self.proj = nn.Linear(dim, dim)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_pattern, self.hook_out = HookPoint(), HookPoint()
        self.hook_z = HookPoint()  # per-head outputs [B,T,H,dh] before proj

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """The position rotation of q or k [B, T, H, dh]."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, self.num_heads, self.head_dim)).unbind(2)
        q = self.hook_q(self.rotate(self.q_norm(q)))
        k = self.hook_k(self.rotate(self.k_norm(k)))
        v = self.hook_v(v)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        o = softmax_attention(q, k, v, self.scale, self.hook_pattern, self.attn_drop if self.training else 0.0)
        return self.hook_out(self.proj(self.hook_z(o.transpose(1, 2)).flatten(-2)))


class VisionMHSA(SoftmaxAttention):
    """Bidirectional softmax attention with QK RMSNorm and 2D RoPE on patches (rbfKAT / reference KATT)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        grid: tuple[int, int],
        *,
        rope_mode: str = "2dv1",
        rope_theta: float = 10000.0,
        attn_drop: float = 0.0,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias=True, attn_drop=attn_drop)
        self.rotary = make_rope(rope_mode, grid, self.head_dim, rope_theta)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """2D RoPE on the patch tokens of q or k [B, T, H, dh]."""
        return self.rotary(x)
