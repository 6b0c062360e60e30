"""GLA's core as one op (kernels/gla_core.py) on CUDA against the fp64 composition of the pieces' references, and in
LKAT-T against the pieces (the same kernels one op each) eager and compiled."""

from __future__ import annotations

import copy

import pytest
import torch
from model_paths import backend_step, errors, lkat_t_and_images
from test_gla_core import GRADS, bound, core_of, handoff_errors, make_case, outputs_and_grads, reference_of
from test_gla_core_trace import OPS, SHORT_KERNELS, WRITES
from tolerance import rel_max
from torch._inductor.utils import run_and_get_code

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize(
    ("B", "T", "H", "segment", "dtype"),
    [(8, 201, 3, 0, "bfloat16"), (8, 201, 3, 0, "float32"), (2, 600, 2, 128, "float32")],
    ids=["lkat_t_bf16", "lkat_t_fp32", "segmented_fp32"],
)
def test_core_matches_fp64_pieces(B: int, T: int, H: int, segment: int, dtype: str) -> None:
    """z and the gradients of y and of every weight, at LKAT-T's heads (64 wide) and in segments, against the fp64
    composition of the pieces' references and the plain recurrence (tests/test_gla_core.py's operands, forms and
    bound: in bf16, within 1.5× of what the pieces' bf16 hand-offs alone cost where that exceeds 3e-2)."""
    flat, dz = make_case(T, H, 64, 64, 16, getattr(torch, dtype), False, batch=B, device="cuda")
    got = outputs_and_grads(core_of, flat, dz, H, segment)
    ref = outputs_and_grads(reference_of, [t.double() for t in flat], dz.double(), H, segment)
    handoff = handoff_errors(flat, dz, H, ref)
    for name, a, b in zip(("z", *GRADS), got, ref, strict=True):
        assert torch.isfinite(a).all(), name
        assert rel_max(a, b) <= bound(dtype, handoff[name]), (name, rel_max(a, b), handoff[name])


def test_lkat_core_matches_the_pieces() -> None:
    """A two-block LKAT-T at 224² with the short GLA: the core as one op gives the pieces' logits and gradients in fp32
    (the same arithmetic; its q/k/v kernel is compiled apart from the pieces' input kernel, so fp32 contractions may
    round differently) and, under bf16 autocast, is as close to the fp32 model as the pieces are (there a rounding
    difference can flip a bf16 hand-off: 5e-4 between the two, H100); "auto" takes the core on CUDA under autocast."""
    model, images = lkat_t_and_images()
    fp32 = {mode: backend_step(model, images, False, attn="short", gla_core=mode) for mode in ("torch", "fused")}
    assert errors(fp32["fused"], fp32["torch"]) < 1e-6
    # auto takes fla's fused_recurrent for fp32, the short kernels under autocast
    bf16 = {mode: errors(backend_step(model, images, True, attn="auto", gla_core=mode), fp32["torch"])
            for mode in ("torch", "fused")}  # fmt: skip
    assert bf16["fused"] <= 1.5 * bf16["torch"] + 1e-3, bf16
    y = torch.zeros(1, 201, 4 * 192 + 16, device="cuda", dtype=torch.bfloat16)
    assert model.set_backends(attn="auto", gla_core="auto").blocks[0].attn.fuses_core(y)
    assert not model.blocks[0].attn.fuses_core(y.float())  # fp32: fla's fused_recurrent, not the short kernels


# The core's Triton kernels, by name (both graphs of tests/test_gla_core_trace.py, one walk): torch.compile traces the
# core's autograd.Function and launches them itself; set for CUDA graphs, the short GLA's two custom ops launch theirs
CORE_KERNELS = {name for kernels in WRITES.values() for name in kernels}
SHORT_OPS = [op for ops in OPS.values() for op in ops]


def test_compiled_lkat_takes_the_core_and_matches_the_pieces() -> None:
    """torch.compile (fullgraph, bf16 autocast) of a one-block LKAT-T with the core, with the core set for CUDA graphs
    and with the pieces (custom ops): the same closeness to the fp32 eager model; inductor's generated code launches
    the core's nine kernels exactly when the core is asked for, six of them and the short GLA's forward and backward
    ops when it is set for CUDA graphs, and the pieces call those ops."""
    model, images = lkat_t_and_images(depth=1)
    truth = backend_step(copy.deepcopy(model), images, attn="auto", gla_core="torch")
    measured = {}
    for mode, graphs in (("torch", False), ("fused", False), ("fused", True)):
        backends = dict(attn="auto", gla_core=mode, cuda_graphs=graphs)
        compiled = torch.compile(copy.deepcopy(model).set_backends(**backends), fullgraph=True)
        step, code = run_and_get_code(backend_step, compiled, images, autocast=True)
        measured[mode, graphs] = errors(step, truth)
        launched = {name for name in CORE_KERNELS if any(name in source for source in code)}
        expected = set() if mode == "torch" else CORE_KERNELS - SHORT_KERNELS if graphs else CORE_KERNELS
        assert launched == expected, (mode, graphs, launched)
        calls_ops = all(any(op in source for source in code) for op in SHORT_OPS)
        assert calls_ops == (mode == "torch" or graphs), (mode, graphs)
    torch.compiler.reset()
    for graphs in (False, True):
        assert measured["fused", graphs] <= 1.01 * measured["torch", False] + 1e-6, measured
