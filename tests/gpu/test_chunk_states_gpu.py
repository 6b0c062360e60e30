"""GLA's chunk states passed in parallel (kernels/chunk_states.py) on CUDA, autotuned, against the torch references
in float64, at LKAT-S's head shape."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tolerance import rel_max

from lkat_lens.kernels import chunk_states

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
SHAPES = [(2, 16389), (6, 4101), (3, 100)]  # 2048^2 and 1024^2 batches: 257 and 65 chunks of 64, the last ragged


def lkat_gates(B: int, T: int, gen: torch.Generator) -> torch.Tensor:
    """LKAT's log gates logsigmoid(randn) / 16, [B, T, 6, 64] in fp32."""
    return F.logsigmoid(torch.randn(B, T, 6, 64, device="cuda", generator=gen)) / 16


def log2_cumsum(gk: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """Chunk-local cumsum of log gates [B, T, H, K] over chunks of `chunk` tokens, in log2 units, gk's dtype."""
    T = gk.shape[1]
    NT = -(-T // chunk)
    padded = F.pad(gk, (0, 0, 0, 0, 0, NT * chunk - T)).unflatten(1, (NT, chunk))
    return (padded.cumsum(2).flatten(1, 2)[:, :T] / math.log(2)).contiguous()


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize(("B", "T"), SHAPES)
def test_scan_matches_reference(B: int, T: int, reverse: bool) -> None:
    gen = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(B, -(-T // 64), 6, 64, 64, device="cuda", generator=gen)
    g = log2_cumsum(lkat_gates(B, T, gen))
    ref = chunk_states.scan_reference(x.double(), g.double(), 64, reverse=reverse)
    assert rel_max(chunk_states.scan(x, g, 64, reverse=reverse), ref) < 1e-5
    assert rel_max(chunk_states.scan(x, g, 64, reverse=reverse, out_dtype=torch.bfloat16), ref) < 1e-2


@pytest.mark.parametrize(("B", "T"), SHAPES)
def test_states_and_gradients_match_references(B: int, T: int) -> None:
    """bf16 operands as in training (the own terms' products in bf16, accumulated in fp32)."""
    gen = torch.Generator(device="cuda").manual_seed(T + 1)
    q, k, v, do = (torch.randn(B, T, 6, 64, device="cuda", generator=gen).bfloat16() for _ in range(4))
    g = log2_cumsum(lkat_gates(B, T, gen))
    gd = g.double()
    h_ref = chunk_states.scan_reference(chunk_states.own_states_reference(k.double(), v.double(), gd, 64), gd, 64)
    own = chunk_states.own_state_grads_reference(q.double(), do.double(), gd, 0.125, 64)
    dh_ref = chunk_states.scan_reference(own, gd, 64, reverse=True)
    assert rel_max(chunk_states.states(k, v, g, 64), h_ref) < 1e-2
    assert rel_max(chunk_states.state_grads(q, do, g, 0.125, 64), dh_ref) < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize(("B", "T"), SHAPES)
def test_states_from_the_gates_match_references(B: int, T: int, dtype: torch.dtype) -> None:
    """From the log gates themselves, in the short kernels' segments of 128 tokens (33 and 129 segments at 1024^2 and
    2048^2): bf16 operands as in training, fp32 ones exactly (IEEE products)."""
    gen = torch.Generator(device="cuda").manual_seed(T + 2)
    q, k, v, do = (torch.randn(B, T, 6, 64, device="cuda", generator=gen).to(dtype) for _ in range(4))
    gk = lkat_gates(B, T, gen)
    g = log2_cumsum(gk.double(), 128)
    h_ref = chunk_states.scan_reference(chunk_states.own_states_reference(k.double(), v.double(), g, 128), g, 128)
    own = chunk_states.own_state_grads_reference(q.double(), do.double(), g, 0.125, 128)
    dh_ref = chunk_states.scan_reference(own, g, 128, reverse=True)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert rel_max(chunk_states.states_from_gates(k, v, gk, 128), h_ref) < tol
    assert rel_max(chunk_states.state_grads_from_gates(q, do, gk, 0.125, 128), dh_ref) < tol
