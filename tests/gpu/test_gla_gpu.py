"""fla's GLA kernels through the dispatcher against the exact torch recurrence, on CUDA."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tolerance import rel_max

from lkat_lens.kernels import gla_fla
from lkat_lens.kernels.gla import gated_linear_attention, gla_recurrent

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TOL = {torch.float32: 1e-3, torch.bfloat16: 2e-2}
LENGTHS = [17, 64, 201, 1024]
CHUNK_FP32_FAULT = "misaligned address"


def make_inputs(T: int, dtype: torch.dtype, B: int = 2, H: int = 4, K: int = 64, V: int = 64) -> list[torch.Tensor]:
    """Random CUDA q, k, v and log gates logsigmoid(randn) / 16, all [B, T, H, *] in dtype."""
    gen = torch.Generator(device="cuda").manual_seed(T)
    q, k = (torch.randn(B, T, H, K, device="cuda", generator=gen) for _ in range(2))
    v = torch.randn(B, T, H, V, device="cuda", generator=gen)
    gk = F.logsigmoid(torch.randn(B, T, H, K, device="cuda", generator=gen)) / 16
    return [x.to(dtype) for x in (q, k, v, gk)]


def output_and_grads(fn, inputs: list[torch.Tensor], weight: torch.Tensor) -> list[torch.Tensor]:
    """fn's output and the gradients of sum(output * weight) w.r.t. q, k, v, gk."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    o = fn(*leaves)
    grads = torch.autograd.grad((o.float() * weight).sum(), leaves)
    return [o.detach(), *grads]


def check_against_recurrence(mode: str, T: int, dtype: torch.dtype, B: int = 2) -> None:
    """Assert the dispatcher's output and gradients match the fp64 torch recurrence within TOL[dtype]."""
    inputs = make_inputs(T, dtype, B=B)
    weight = torch.randn_like(inputs[2], dtype=torch.float32)
    scale = 0.1
    got = output_and_grads(lambda *x: gated_linear_attention(*x, scale=scale, mode=mode), inputs, weight)
    ref = output_and_grads(lambda *x: gla_recurrent(*(t.double() for t in x), scale=scale)[0], inputs, weight.double())
    assert got[0].dtype == dtype and got[0].shape == inputs[2].shape
    for name, g, r in zip(("o", "dq", "dk", "dv", "dgk"), got, ref, strict=True):
        assert torch.isfinite(g).all(), name
        assert rel_max(g, r) < TOL[dtype], (name, rel_max(g, r))


@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize(
    ("mode", "dtype"),
    [
        ("chunk", torch.bfloat16),
        ("fused_recurrent", torch.float32),
        ("fused_recurrent", torch.bfloat16),
        ("auto", torch.float32),
        ("auto", torch.bfloat16),
        ("torch", torch.float32),
        ("torch", torch.bfloat16),
    ],
    ids=str,
)
def test_dispatcher_matches_recurrence(mode: str, dtype: torch.dtype, T: int) -> None:
    check_against_recurrence(mode, T, dtype)


@pytest.mark.parametrize(("T", "B"), [(17, 3), (64, 2), (201, 2), (1000, 2), (4100, 1)])
@pytest.mark.parametrize("states", ["serial", "parallel"])
def test_chunk_state_passing_matches_recurrence(states: str, T: int, B: int, monkeypatch) -> None:
    """Chunk mode passing states serially (fla's chunk kernels alone) and in parallel (kernels.chunk_states with
    fla's other chunk kernels) at every T, ragged last chunks and 65 chunks in one sequence included."""
    monkeypatch.setattr(gla_fla, "PARALLEL_STATES_MIN_T", 0 if states == "parallel" else T + 1)
    assert gla_fla.parallel_states(T) == (states == "parallel")
    check_against_recurrence("chunk", T, torch.bfloat16, B=B)


def test_fla_chunk_fp32_matches_recurrence() -> None:
    """fla's chunk_gla on fp32, in a child process: its known fault there would poison this CUDA context."""
    code = (
        f"import sys, torch; sys.path[:0] = {[str(Path(__file__).parent), str(Path(__file__).parents[1])]!r}\n"
        "import test_gla_gpu as t\n"
        f"for T in {LENGTHS}: t.check_against_recurrence('chunk', T, torch.float32)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    if run.returncode and CHUNK_FP32_FAULT in run.stderr:
        pytest.xfail(f"fla chunk_gla faults on fp32 inputs here ({CHUNK_FP32_FAULT}); 'auto' avoids it")
    assert run.returncode == 0, run.stderr[-4000:]
