"""GLA's chunk states passed in parallel (kernels/chunk_states.py): the kernels under the Triton interpreter against
the torch references in float64, and the references against the plain recurrence over tokens and its autograd.

The kernels run on CPU through the Triton interpreter, in a child process started with TRITON_INTERPRET=1 unless
this process already runs that way (see triton_interpreter.py).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import triton_interpreter
from tolerance import rel_max

from lkat_lens.kernels import chunk_states
from lkat_lens.kernels.gla import gla_recurrent

TOL = {"float32": 2e-6, "bfloat16": 1e-2}
# From the gates themselves the kernels sum up to 256 gates in fp32 for each decay (against the reference's fp64
# cumsum): ~1e-6 more rounding in the exponent.
TOL_FROM_GATES = {"float32": 1e-5, "bfloat16": 1e-2}
# id -> (B, T, H, K, V, chunk size, reverse, output dtype, gate scale)
SCAN_CASES = {
    f"B{B}-T{T}-H{H}-K{K}-V{V}-c{c}-{'reverse' if rev else 'forward'}-{dtype}-g{scale:g}": (
        B,
        T,
        H,
        K,
        V,
        c,
        rev,
        dtype,
        scale,
    )  # fmt: skip
    for B, T, H, K, V, c, rev, dtype, scale in [
        (2, 37, 3, 16, 8, 8, False, "float32", 1.0),  # ragged last chunk, one block of chunks and a part
        (2, 37, 3, 16, 8, 8, True, "float32", 1.0),
        (1, 130, 2, 8, 20, 4, False, "float32", 0.05),  # 33 chunks: 9 blocks; 160 elements: a ragged tile
        (1, 130, 2, 8, 20, 4, True, "float32", 0.05),
        (3, 16, 1, 4, 4, 16, False, "float32", 1.0),  # one chunk: y = x
        (2, 64, 2, 16, 16, 8, False, "bfloat16", 0.1),  # states written in bf16, as the forward keeps them
        (2, 64, 2, 16, 16, 8, True, "float32", 400.0),  # decays underflow to 0: each chunk starts afresh
        (2, 64, 2, 16, 16, 8, False, "float32", 0.0),  # no decay: plain running sums
    ]
}
# id -> (B, T, H, K, V, chunk size): the own-term kernels (tl.dot: chunks of 16 or more)
STATE_CASES = {
    f"B{B}-T{T}-H{H}-K{K}-V{V}-c{c}": (B, T, H, K, V, c)
    for B, T, H, K, V, c in [
        (2, 70, 2, 16, 32, 16),  # ragged last chunk
        (1, 64, 3, 32, 16, 32),  # whole chunks
        (1, 20, 1, 24, 40, 16),  # head dims off the 16 x 16 tile
        (2, 300, 2, 16, 16, 128),  # chunks of two token blocks (64 each), the last chunk ragged
        (1, 200, 1, 32, 16, 256),  # one whole chunk and a ragged one of three blocks and a part
    ]
}
# id -> (B, T, H, K, V, chunk size): states and state gradients from the log gates themselves (gla_short's segments)
FROM_GATES_CASES = {
    f"B{B}-T{T}-H{H}-K{K}-V{V}-c{c}": (B, T, H, K, V, c)
    for B, T, H, K, V, c in [
        (2, 37, 3, 16, 16, 16),  # ragged last chunk
        (1, 200, 2, 24, 40, 64),  # head dims off the tile
        (2, 300, 1, 16, 16, 128),  # two token blocks a chunk
        (1, 300, 2, 32, 16, 256),  # four blocks, the last chunk three blocks and a part
    ]
}


def chunk_cumsum(gk: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Chunk-local cumsum over t of [B, T, H, K] log gates in log2 units, as fla's chunk_local_cumsum(scale=1/ln 2)."""
    B, T, H, K = gk.shape
    NT = -(-T // chunk_size)
    padded = F.pad(gk, (0, 0, 0, 0, 0, NT * chunk_size - T)).reshape(B, NT, chunk_size, H, K)
    return (padded.cumsum(2).reshape(B, NT * chunk_size, H, K)[:, :T] / math.log(2)).contiguous()


def gates(B, T, H, K, c, scale, gen, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(log gates logsigmoid(randn) * scale, their chunk-local log2 cumsum), [B, T, H, K]."""
    gk = F.logsigmoid(torch.randn(B, T, H, K, generator=gen, dtype=dtype)) * scale
    return gk, chunk_cumsum(gk, c)


def scan_case(B, T, H, K, V, c, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [B, NT, H, K, V], log2 gate cumsum [B, T, H, K])."""
    gen = torch.Generator().manual_seed(T + K)
    x = torch.randn(B, -(-T // c), H, K, V, generator=gen)
    return x, gates(B, T, H, K, c, scale, gen)[1]


def _measure_scan(case: tuple) -> dict:
    B, T, H, K, V, c, reverse, dtype, scale = case
    x, g = scan_case(B, T, H, K, V, c, scale)
    y = chunk_states.scan(x, g, c, reverse=reverse, out_dtype=getattr(torch, dtype))
    ref = chunk_states.scan_reference(x.double(), g.double(), c, reverse=reverse)
    unchanged = torch.equal(x, scan_case(*case[:6], scale)[0])
    return {"error": rel_max(y, ref), "dtype": str(y.dtype), "x_unchanged": unchanged}


def _measure_states(case: tuple) -> dict:
    """states() and state_grads() (own-term kernels, then the scan) against the references in fp64."""
    B, T, H, K, V, c = case
    gen = torch.Generator().manual_seed(T)
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    v, do = (torch.randn(B, T, H, V, generator=gen) for _ in range(2))
    g = gates(B, T, H, K, c, 0.25, gen)[1]
    h = chunk_states.states(k, v, g, c)
    dh = chunk_states.state_grads(q, do, g, 0.3, c)
    gd = g.double()
    h_ref = chunk_states.scan_reference(chunk_states.own_states_reference(k.double(), v.double(), gd, c), gd, c)
    own = chunk_states.own_state_grads_reference(q.double(), do.double(), gd, 0.3, c)
    dh_ref = chunk_states.scan_reference(own, gd, c, reverse=True)
    return {"h": rel_max(h, h_ref), "dh": rel_max(dh, dh_ref), "dtypes": [str(h.dtype), str(dh.dtype)]}


def _measure_from_gates(case: tuple) -> dict:
    """states_from_gates and state_grads_from_gates (fp32 and bf16 operands, fp32 gates) against the references in
    fp64 from the gates' chunk-local cumsum (chunk_cumsum)."""
    B, T, H, K, V, c = case
    gen = torch.Generator().manual_seed(T + c)
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    v, do = (torch.randn(B, T, H, V, generator=gen) for _ in range(2))
    gk, g = gates(B, T, H, K, c, 0.25, gen)
    gd = g.double()
    h_ref = chunk_states.scan_reference(chunk_states.own_states_reference(k.double(), v.double(), gd, c), gd, c)
    own = chunk_states.own_state_grads_reference(q.double(), do.double(), gd, 0.3, c)
    dh_ref = chunk_states.scan_reference(own, gd, c, reverse=True)
    errors = {}
    for dtype in (torch.float32, torch.bfloat16):
        h = chunk_states.states_from_gates(k.to(dtype), v.to(dtype), gk, c)
        dh = chunk_states.state_grads_from_gates(q.to(dtype), do.to(dtype), gk, 0.3, c)
        errors[str(dtype)] = {"h": rel_max(h, h_ref), "dh": rel_max(dh, dh_ref)}
        errors["dtypes"] = [str(h.dtype), str(dh.dtype)]
    return errors


def _every_tile() -> dict:
    """The scan's error on one case at each (element tile, chunk block) the CUDA autotuner tries: 38 chunks, so
    every tile walks two or more chunk blocks, the last one partial, and 320 elements (a partial tile of 128)."""
    errors, tile = {}, dict(chunk_states._INTERP_TILE)
    try:
        for be, bc, _ in chunk_states._SCAN_CONFIGS:
            chunk_states._INTERP_TILE.update(BE=be, BC=bc)
            errors[f"{be}x{bc}"] = _measure_scan((2, 150, 1, 16, 20, 4, True, "float32", 0.05))["error"]
    finally:
        chunk_states._INTERP_TILE.update(tile)
    return errors


def interpreter_measurements() -> dict:
    """Every case's measurements (needs TRITON_INTERPRET=1 before triton was imported)."""
    return {
        "scan": {cid: _measure_scan(case) for cid, case in SCAN_CASES.items()},
        "states": {cid: _measure_states(case) for cid, case in STATE_CASES.items()},
        "tiles": _every_tile(),
        "from_gates": {cid: _measure_from_gates(case) for cid, case in FROM_GATES_CASES.items()},
    }


@pytest.fixture(scope="module")
def interp() -> dict:
    return triton_interpreter.measurements(__file__, chunk_states.INTERPRET, interpreter_measurements)


@pytest.mark.parametrize("case_id", list(SCAN_CASES))
def test_scan_matches_fp64_reference(interp: dict, case_id: str) -> None:
    measured, dtype = interp["scan"][case_id], SCAN_CASES[case_id][7]
    assert measured["dtype"] == f"torch.{dtype}" and measured["x_unchanged"], measured
    assert measured["error"] <= TOL[dtype], measured


def test_every_autotuned_scan_tile_gives_the_same_states(interp: dict) -> None:
    assert len(interp["tiles"]) == len({(be, bc) for be, bc, _ in chunk_states._SCAN_CONFIGS}), interp["tiles"]
    assert max(interp["tiles"].values()) <= TOL["float32"], interp["tiles"]


@pytest.mark.parametrize("case_id", list(STATE_CASES))
def test_states_and_their_gradients_match_fp64_references(interp: dict, case_id: str) -> None:
    measured = interp["states"][case_id]
    assert measured["dtypes"] == ["torch.float32", "torch.float32"], measured
    assert measured["h"] <= TOL["float32"] and measured["dh"] <= TOL["float32"], measured


@pytest.mark.parametrize("case_id", list(FROM_GATES_CASES))
def test_states_from_the_gates_themselves_match_fp64_references(interp: dict, case_id: str) -> None:
    measured = interp["from_gates"][case_id]
    assert measured["dtypes"] == ["torch.float32", "torch.float32"], measured
    for dtype, tol in (("torch.float32", TOL_FROM_GATES["float32"]), ("torch.bfloat16", TOL_FROM_GATES["bfloat16"])):
        assert measured[dtype]["h"] <= tol and measured[dtype]["dh"] <= tol, measured


def _output_from_states(q, k, v, b, h, scale, c) -> torch.Tensor:
    """o_t = scale * ((q_t 2^b_t) h[chunk of t] + the causal part inside the chunk), [B, T, H, V]."""
    B, T, H, _ = q.shape
    o = q.new_empty(B, T, H, v.shape[-1])
    for t in range(T):
        i, start = t // c, (t // c) * c
        inter = torch.einsum("bhk,bhkv->bhv", q[:, t] * torch.exp2(b[:, t]), h[:, i])
        decay = torch.exp2(b[:, t : t + 1] - b[:, start : t + 1])
        intra = torch.einsum("bhk,bshk,bshv->bhv", q[:, t], k[:, start : t + 1] * decay, v[:, start : t + 1])
        o[:, t] = (inter + intra) * scale
    return o


def test_references_give_the_recurrences_output_and_gradients() -> None:
    """Independent check of the references' semantics in fp64: the states (own terms scanned forward) give
    gla_recurrent's output, and the state gradients (own gradient terms scanned in reverse) are autograd's
    gradients of that output with respect to the own terms that enter the state after each chunk."""
    B, T, H, K, V, c, scale = 2, 45, 2, 4, 3, 8, 0.5
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, T, H, K, generator=gen, dtype=torch.float64) for _ in range(2))
    v, do = (torch.randn(B, T, H, V, generator=gen, dtype=torch.float64) for _ in range(2))
    gk, b = gates(B, T, H, K, c, 0.25, gen, torch.float64)
    own = chunk_states.own_states_reference(k, v, b, c).requires_grad_()
    o = _output_from_states(q, k, v, b, chunk_states.scan_reference(own, b, c), scale, c)
    assert rel_max(o, gla_recurrent(q, k, v, gk, scale=scale)[0]) < 1e-12
    (grad_own,) = torch.autograd.grad(o, own, do)
    dh = chunk_states.scan_reference(chunk_states.own_state_grads_reference(q, do, b, scale, c), b, c, reverse=True)
    assert rel_max(dh[:, :-1], grad_own[:, 1:]) < 1e-12 and not dh[:, -1].any()


def test_mismatched_shapes_are_refused() -> None:
    x, g = scan_case(1, 20, 1, 4, 4, 8, 1.0)
    with pytest.raises(ValueError, match="do not fit gates"):
        chunk_states.scan(x, g, 4)
    with pytest.raises(ValueError, match="do not fit chunks"):
        chunk_states.states(g, g, g, 8)
    with pytest.raises(ValueError, match="do not fit chunks"):
        chunk_states.states(g, g, g, 48)
    with pytest.raises(ValueError, match="do not fit chunks"):
        chunk_states.states_from_gates(g, g, g, 24)


if __name__ == "__main__":
    triton_interpreter.report(interpreter_measurements)
