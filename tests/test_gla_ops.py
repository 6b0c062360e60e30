"""GLA ops on CPU: the torch recurrence against fla's naive reference, the chunked form, implicit attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fla.ops.gla.naive import naive_recurrent_gla
from tolerance import assert_close, rel_max

from lkat_lens.kernels.gla import (
    gated_linear_attention,
    gla_chunked,
    gla_recurrent,
    implicit_attention,
    implicit_attention_row,
    kernel_path,
)

GATES = {"mild": 1 / 16, "strong": 2.0}


def make_inputs(
    B: int, T: int, H: int, K: int, V: int, gate: str = "mild", dtype: torch.dtype = torch.float32, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random q, k, v [B,T,H,*] and log forget gates logsigmoid(randn) * GATES[gate]."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen, dtype=dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen, dtype=dtype)
    gk = F.logsigmoid(torch.randn(B, T, H, K, generator=gen, dtype=dtype)) * GATES[gate]
    return q, k, v, gk


@pytest.mark.parametrize("gate", sorted(GATES))
@pytest.mark.parametrize(("B", "T", "H", "K", "V"), [(2, 1, 2, 8, 8), (3, 17, 2, 16, 8), (2, 201, 3, 8, 16)])
def test_recurrent_matches_fla_naive(B: int, T: int, H: int, K: int, V: int, gate: str) -> None:
    q, k, v, gk = make_inputs(B, T, H, K, V, gate)
    h0 = torch.randn(B, H, K, V)
    o, ht = gla_recurrent(q, k, v, gk, initial_state=h0, output_final_state=True)
    o_ref, ht_ref = naive_recurrent_gla(q, k, v, gk, initial_state=h0, output_final_state=True)
    assert o.shape == (B, T, H, V) and o.dtype == q.dtype
    assert rel_max(o, o_ref) < 1e-5
    assert rel_max(ht, ht_ref) < 1e-5
    o_plain, none = gla_recurrent(q, k, v, gk)
    assert none is None
    assert rel_max(o_plain, naive_recurrent_gla(q, k, v, gk)[0]) < 1e-5


def test_recurrent_scale_and_bf16() -> None:
    q, k, v, gk = make_inputs(2, 9, 2, 8, 4)
    o1 = gla_recurrent(q, k, v, gk, scale=1.0)[0]
    o_default = gla_recurrent(q, k, v, gk)[0]
    assert_close(o1 * 8**-0.5, o_default, rtol=1e-6, atol=1e-6)
    o_bf16 = gla_recurrent(*(x.bfloat16() for x in (q, k, v, gk)))[0]
    assert o_bf16.dtype == torch.bfloat16
    assert rel_max(o_bf16, o_default) < 2e-2


@pytest.mark.parametrize("gate", sorted(GATES))
@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("T", [1, 17, 65, 201])
def test_chunked_matches_recurrent(T: int, chunk_size: int, gate: str) -> None:
    B, H, K, V = 2, 2, 16, 8
    q, k, v, gk = make_inputs(B, T, H, K, V, gate, dtype=torch.float64)
    h0 = torch.randn(B, H, K, V, dtype=torch.float64)
    o_ref, ht_ref = gla_recurrent(q, k, v, gk, initial_state=h0, output_final_state=True)
    o, ht = gla_chunked(q, k, v, gk, chunk_size=chunk_size, initial_state=h0, output_final_state=True)
    assert rel_max(o, o_ref) < 1e-12 and rel_max(ht, ht_ref) < 1e-12
    q32, k32, v32, gk32, h32 = (x.float() for x in (q, k, v, gk, h0))
    o32, ht32 = gla_chunked(q32, k32, v32, gk32, chunk_size=chunk_size, initial_state=h32, output_final_state=True)
    assert o32.dtype == torch.float32
    assert rel_max(o32, o_ref) < 1e-5 and rel_max(ht32, ht_ref) < 1e-5
    o_zero, none = gla_chunked(q, k, v, gk, chunk_size=chunk_size)
    assert none is None
    assert rel_max(o_zero, gla_recurrent(q, k, v, gk)[0]) < 1e-12


def test_chunked_extreme_gates_stay_finite() -> None:
    q, k, v, _ = make_inputs(1, 130, 2, 8, 8, dtype=torch.float64)
    gk = torch.full_like(q, -30.0)
    gk[:, ::7] = 0.0
    o_ref, ht_ref = gla_recurrent(q, k, v, gk, output_final_state=True)
    o, ht = gla_chunked(q, k, v, gk, output_final_state=True)
    o32, _ = gla_chunked(q.float(), k.float(), v.float(), gk.float())
    assert torch.isfinite(o32).all()
    assert rel_max(o, o_ref) < 1e-12 and rel_max(ht, ht_ref) < 1e-12
    assert rel_max(o32, o_ref) < 1e-5


@pytest.mark.parametrize("gate", sorted(GATES))
def test_chunked_gradients_match_recurrent(gate: str) -> None:
    B, T, H, K, V = 2, 37, 2, 8, 4
    inputs = [x.requires_grad_() for x in make_inputs(B, T, H, K, V, gate, dtype=torch.float64)]
    h0 = torch.randn(B, H, K, V, dtype=torch.float64, requires_grad=True)
    w_o, w_h = torch.randn(B, T, H, V, dtype=torch.float64), torch.randn(B, H, K, V, dtype=torch.float64)

    def grads(fn, **kw) -> tuple[torch.Tensor, ...]:
        o, ht = fn(*inputs, initial_state=h0, output_final_state=True, **kw)
        return torch.autograd.grad((o * w_o).sum() + (ht * w_h).sum(), [*inputs, h0])

    for g, g_ref in zip(grads(gla_chunked, chunk_size=16), grads(gla_recurrent), strict=True):
        assert rel_max(g, g_ref) < 1e-11


@pytest.mark.parametrize("gate", sorted(GATES))
@pytest.mark.parametrize(("T", "block_size"), [(1, 64), (23, 8), (150, 64)])
def test_implicit_attention_reproduces_output(T: int, block_size: int, gate: str) -> None:
    B, H, K, V = 2, 3, 16, 8
    q, k, v, gk = make_inputs(B, T, H, K, V, gate, dtype=torch.float64)
    o_ref = gla_recurrent(q, k, v, gk)[0]
    A = implicit_attention(q, k, gk, block_size=block_size)
    assert A.shape == (B, H, T, T) and A.dtype == torch.float64
    assert (A.triu(1) == 0).all()
    assert rel_max((A @ v.transpose(1, 2)).transpose(1, 2), o_ref) < 1e-12
    A32 = implicit_attention(q.float(), k.float(), gk.float(), block_size=block_size)
    assert A32.dtype == torch.float32
    assert rel_max((A32 @ v.float().transpose(1, 2)).transpose(1, 2), o_ref) < 1e-5
    for t in (0, T // 2, -1):
        assert_close(implicit_attention_row(q, k, gk, t), A[:, :, t], rtol=1e-12, atol=1e-12)


def test_implicit_attention_entries_and_scale() -> None:
    q, k, _, gk = make_inputs(1, 6, 1, 4, 4, dtype=torch.float64)
    A = implicit_attention(q, k, gk, scale=0.5)
    G = gk.cumsum(1)
    t, s = 5, 2
    entry = 0.5 * (q[0, t, 0] * k[0, s, 0] * (G[0, t, 0] - G[0, s, 0]).exp()).sum()
    assert abs(A[0, 0, t, s].item() - entry.item()) < 1e-14
    with pytest.raises(IndexError):
        implicit_attention_row(q, k, gk, 6)


def test_dispatcher_on_cpu_runs_torch_path() -> None:
    q, k, v, gk = make_inputs(2, 45, 2, 8, 8)
    o_ref = gla_recurrent(q, k, v, gk, scale=0.3)[0]
    for mode in ("auto", "torch", "chunk", "fused_recurrent", "short"):
        o = gated_linear_attention(q, k, v, gk, scale=0.3, mode=mode)
        assert o.shape == v.shape and rel_max(o, o_ref) < 1e-5
    with pytest.raises(ValueError, match="unknown GLA mode"):
        gated_linear_attention(q, k, v, gk, mode="parallel")


@pytest.mark.parametrize(
    ("T", "head_dim", "dtype", "grad", "expected"),
    [
        (201, 64, torch.bfloat16, True, "short"),  # training at the lengths where short was faster
        (401, 64, torch.bfloat16, True, "short"),
        (201, 64, torch.bfloat16, False, "short"),  # inference: short's forward was faster too
        (1029, 64, torch.bfloat16, True, "short"),  # a 512^2 image's tokens: walked in segments
        (16389, 64, torch.bfloat16, True, "short"),  # 2048^2: segments too
        (16389, 64, torch.bfloat16, False, "short"),
        (201, 48, torch.bfloat16, True, "chunk"),  # a head dim the short kernel does not take
        (21, 64, torch.bfloat16, True, "fused_recurrent"),  # T <= AUTO_RECURRENT_MAX_T
        (201, 64, torch.float32, True, "fused_recurrent"),  # chunk faults on fp32
    ],
)
def test_auto_mode_rule(T: int, head_dim: int, dtype: torch.dtype, grad: bool, expected: str) -> None:
    """The CUDA kernel "auto" picks, from length, head dim and dtype, with or without a gradient (the rule only
    reads the device's type, shapes and dtypes; on the CPU every mode but an interpreted "short" takes torch's)."""
    with torch.set_grad_enabled(grad):
        assert kernel_path("auto", torch.device("cuda"), T, dtype, head_dim, head_dim) == expected
        assert kernel_path("auto", torch.device("cpu"), T, dtype, head_dim, head_dim) == "torch"
