"""Our kernels as torch custom ops (issue 19): registrations, CPU values against independent references, and
torch.compile tracing a whole LKAT with no graph break. The CUDA side is tests/gpu/test_compile_gpu.py.

The Triton paths' registrations are checked under the Triton interpreter, in a child process with TRITON_INTERPRET=1
unless this one runs that way (tests/triton_interpreter.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton_interpreter
from tolerance import rel_norm

import lkat_lens
from lkat_lens.kernels import gla_fla, kan_linear, kan_triton, rbf
from lkat_lens.kernels.gla import gla_recurrent

GRID = (-2.0, 2.0)


def opcheck(op, args: tuple) -> None:
    """torch.library.opcheck: schema, fake tensors, autograd registration, AOT dispatch."""
    results = torch.library.opcheck(op, args)
    assert set(results.values()) == {"SUCCESS"}, results


def test_rbf_op_registrations():
    """fp32 x with a shared curve written in bf16; strided bf16 x with per-channel curves; the backward op."""
    x = torch.randn(3, 5, 6, requires_grad=True)
    opcheck(rbf._rbf_op, (x, torch.randn(1, 4, requires_grad=True), *GRID, False, torch.bfloat16))
    x16 = torch.randn(5, 3, 6, dtype=torch.bfloat16, requires_grad=True).transpose(0, 1)
    opcheck(rbf._rbf_op, (x16, torch.randn(6, 4, requires_grad=True), *GRID, False, torch.bfloat16))
    opcheck(rbf._rbf_backward_op, (x.detach(), torch.randn(6, 4), torch.randn(3, 5, 6).bfloat16(), *GRID, False))


def test_rbf_out_dtype_is_the_rounded_fp32_result():
    """Writing psi in bf16 gives exactly the fp32 result rounded once, and its gradients are those of fp32."""
    x = torch.randn(4, 7, requires_grad=True)
    weight = torch.randn(7, 4, requires_grad=True)
    y32 = rbf.rbf_grid_linear(x, weight, *GRID, backend="torch")
    y16 = rbf.rbf_grid_linear(x, weight, *GRID, backend="torch", out_dtype=torch.bfloat16)
    assert y16.dtype == torch.bfloat16 and torch.equal(y16, y32.to(torch.bfloat16))
    dy = torch.randn(4, 7).to(torch.bfloat16)
    g16 = torch.autograd.grad(y16, (x, weight), dy)
    g32 = torch.autograd.grad(y32, (x, weight), dy.float())
    assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-6 * b.abs().max().item()) for a, b in zip(g16, g32, strict=True))


def test_fused_kan_op_registrations():
    """Shared curve in fp32, per-channel curves and the edge basis in bf16; the backward ops with every gradient
    subset."""
    x = torch.randn(2, 5, 6, requires_grad=True)
    opcheck(
        kan_linear._kan_fused_op, (x, torch.randn(1, 4, requires_grad=True), torch.randn(3, 6).requires_grad_(), *GRID)
    )
    x16, w16 = (torch.randn(*shape, dtype=torch.bfloat16, requires_grad=True) for shape in ((2, 5, 6), (3, 6)))
    opcheck(kan_linear._kan_fused_op, (x16, torch.randn(6, 4, requires_grad=True), w16, *GRID))
    edge_weight = torch.randn(3, 24, dtype=torch.bfloat16, requires_grad=True)
    opcheck(kan_linear._edge_fused_op, (x16, edge_weight, *GRID, 4))
    dy = torch.randn(2, 5, 3)
    for need_dx, need_dw in ((True, True), (True, False), (False, True)):
        args = (x.detach(), torch.randn(6, 4), torch.randn(3, 6), dy, *GRID, need_dx, need_dw)
        opcheck(kan_linear._kan_fused_backward_op, args)
        opcheck(kan_linear._edge_fused_backward_op, (x.detach(), torch.randn(3, 24), dy, *GRID, 4, need_dx, need_dw))


def test_fused_kan_ops_on_cpu_match_autograd_of_the_references():
    """The CPU kernels' explicit backward formulas against autograd through the unfused references (fp64)."""
    x = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    grid_weight = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    edge_weight = torch.randn(5, 24, dtype=torch.float64, requires_grad=True)
    cases = {
        "kan": (
            lambda *a: kan_linear._kan_fused_op(*a, *GRID),
            lambda *a: kan_linear.kan_linear_reference(*a, *GRID),
            (x, grid_weight, weight),
        ),
        "edge": (
            lambda *a: kan_linear._edge_fused_op(*a, *GRID, 4),
            lambda *a: kan_linear.edge_linear_reference(*a, *GRID, 4),
            (x, edge_weight),
        ),
    }
    for name, (op, reference, inputs) in cases.items():
        y, y_ref = op(*inputs), reference(*inputs)
        dy = torch.randn_like(y)
        for got, want in zip(torch.autograd.grad(y, inputs, dy), torch.autograd.grad(y_ref, inputs, dy), strict=True):
            assert rel_norm(got, want) < 1e-12, name
        assert rel_norm(y, y_ref) < 1e-14, name


def interpreter_opchecks() -> dict:
    """opcheck's results for the ops on their Triton paths (needs TRITON_INTERPRET=1 before triton was imported)."""
    torch.manual_seed(0)
    x = torch.randn(3, 5, 6, requires_grad=True)
    x16 = torch.randn(5, 3, 6, dtype=torch.bfloat16).transpose(0, 1).requires_grad_()
    cases = {
        "rbf shared, bf16 out": (rbf._rbf_op, (x, torch.randn(1, 4, requires_grad=True), *GRID, True, torch.bfloat16)),
        "rbf channel, strided bf16 x": (
            rbf._rbf_op,
            (x16, torch.randn(6, 4, requires_grad=True), *GRID, True, x16.dtype),
        ),
        "fused kan": (
            kan_linear._kan_fused_op,
            (x, torch.randn(6, 4, requires_grad=True), torch.randn(3, 6, requires_grad=True), *GRID),
        ),
        "fused edge": (kan_linear._edge_fused_op, (x, torch.randn(3, 24, requires_grad=True), *GRID, 4)),
    }
    return {name: torch.library.opcheck(op, args) for name, (op, args) in cases.items()}


def test_triton_paths_registrations_under_the_interpreter():
    results = triton_interpreter.measurements(__file__, kan_triton.INTERPRET, interpreter_opchecks)
    assert len(results) == 4
    for name, checks in results.items():
        assert set(checks.values()) == {"SUCCESS"}, (name, checks)


@pytest.fixture(scope="module")
def gla_inputs() -> tuple[torch.Tensor, ...]:
    """q, k, v [B, T, H, K] and log gates gk <= 0, ragged T."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 19, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    gk = F.logsigmoid(torch.randn(2, 19, 2, 8, generator=g, dtype=torch.float64)) / 4
    return q, k, v, gk


@pytest.mark.parametrize("mode", gla_fla.MODES)
def test_fla_gla_op_registrations(gla_inputs, mode):
    q, k, v, gk = (t.float().requires_grad_() for t in gla_inputs)
    opcheck(gla_fla._fla_gla_op, (q, k, v, gk, 0.3, mode))


def test_fla_gla_op_on_cpu_matches_the_recurrence(gla_inputs):
    """Forward and gradients of the op (CPU: the torch chunked form) against the plain recurrence, in fp64; the
    backward op's fake outputs have the real ones' shapes and dtypes."""
    q, k, v, gk = (t.clone().requires_grad_() for t in gla_inputs)
    o = gla_fla.fla_gla(q, k, v, gk, 0.3, "chunk")
    o_ref = gla_recurrent(q, k, v, gk, scale=0.3)[0]
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v, gk), do)
    grads_ref = torch.autograd.grad(o_ref, (q, k, v, gk), do)
    assert rel_norm(o, o_ref) < 1e-12
    assert all(rel_norm(a, b) < 1e-10 for a, b in zip(grads, grads_ref, strict=True))
    kept = gla_fla._fla_gla_op(*gla_inputs, 0.3, "chunk")[1:]  # nothing on the CPU: two empty tensors
    assert [t.numel() for t in kept] == [0, 0]
    real = gla_fla._fla_gla_backward_op(*gla_inputs, *kept, do, 0.3, "chunk")
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake_args = (mode.from_tensor(t) for t in (*gla_inputs, *kept, do))
        fake = gla_fla._fla_gla_backward_op(*fake_args, 0.3, "chunk")
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in real]
    with pytest.raises(ValueError, match="unknown fla GLA mode"):
        gla_fla.fla_gla(q, k, v, gk, 0.3, "short")


def block_of_ops(x, grid_weight, w1, edge_weight, w_qkv):
    """A block-shaped function through every op: GLA (fla op), shared KAN (fused op), RBF op + matmul, edge KAN."""
    q, k, v = ((x @ w).unflatten(-1, (2, 8)) for w in w_qkv.unbind(0))
    o = gla_fla.fla_gla(q, k, v, F.logsigmoid(k) / 8, 0.25, "fused_recurrent").flatten(-2)
    h = kan_linear._kan_fused_op(o, grid_weight, w1, *GRID)
    h = rbf.rbf_grid_linear(h, grid_weight, *GRID, backend="torch") @ w1
    return kan_linear._edge_fused_op(h, edge_weight, *GRID, 4)


def test_compiled_ops_fullgraph_match_eager():
    """torch.compile(fullgraph=True) traces every op (forward and, through AOT autograd, backward) with the same
    values and gradients as eager."""
    g = torch.Generator().manual_seed(0)
    inputs = [
        torch.randn(2, 9, 16, generator=g),
        torch.randn(1, 4, generator=g),
        torch.randn(24, 16, generator=g) / 4,
        torch.randn(5, 64, generator=g) / 8,
        torch.randn(3, 16, 16, generator=g) / 4,
    ]
    eager = [t.clone().requires_grad_() for t in inputs]
    traced = [t.clone().requires_grad_() for t in inputs]
    y = block_of_ops(*eager)
    y_c = torch.compile(block_of_ops, backend="aot_eager", fullgraph=True)(*traced)
    dy = torch.randn_like(y)
    y.backward(dy)
    y_c.backward(dy)
    assert rel_norm(y_c, y) < 1e-6
    assert all(rel_norm(b.grad, a.grad) < 1e-5 for a, b in zip(eager, traced, strict=True))


def test_lkat_micro_compiles_without_graph_breaks():
    """A whole lkat_micro under bf16 autocast: one graph, no break (dynamo's explain)."""
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_micro", num_classes=10).train()
    x = torch.randn(2, 3, 16, 16)

    def step(images):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(images)

    explained = torch._dynamo.explain(step)(x)
    torch._dynamo.reset()
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


@pytest.fixture(scope="module")
def gla_layer() -> torch.nn.Module:
    """The first GLA layer of a seeded lkat_micro."""
    torch.manual_seed(0)
    return lkat_lens.create_model("lkat_micro", num_classes=10).blocks[0].attn


def test_stacked_projection_is_the_five_linears(gla_layer):
    """VisionGLA.project_stacked (one matmul of stacked weights), split, equals q/k/v/g_proj and gk_proj[0] applied
    one by one."""
    x = torch.randn(2, 21, 64)
    linears = (gla_layer.q_proj, gla_layer.k_proj, gla_layer.v_proj, gla_layer.g_proj, gla_layer.gk_proj[0])
    for got, linear in zip(gla_layer.split_projection(gla_layer.project_stacked(x)), linears, strict=True):
        want = linear(x)
        assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-6 * want.abs().max().item())


def copies_of_shape(fn, shape: list[int]) -> int:
    """How many dtype copies (aten::_to_copy) of a tensor of `shape` fn makes (torch.profiler)."""
    with torch.profiler.profile(record_shapes=True) as prof:
        fn()
    events = prof.key_averages(group_by_input_shape=True)
    return sum(e.count for e in events if e.key == "aten::_to_copy" and e.input_shapes[:1] == [shape])


def test_gla_layer_under_autocast_casts_its_input_once_and_keeps_the_output_path_in_bf16(gla_layer):
    """Under bf16 autocast the fp32 input is cast once (not once per projection), the gated norm runs in bf16
    (no fp32 round trip of o); the output agrees with the fp32 layer to bf16 accuracy."""
    x = torch.randn(2, 21, 64)

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return gla_layer(x)

    assert copies_of_shape(forward, [2, 21, 64]) + copies_of_shape(forward, [2 * 21, 64]) == 1  # x or its rows
    out, exact = forward(), gla_layer(x)
    assert out.dtype == torch.bfloat16 and rel_norm(out, exact) < 3e-2
    o, g = torch.randn(2, 21, 2, 32).bfloat16(), torch.randn(2, 21, 2, 32).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = gla_layer.gated_norm(o, g)
    unfused = gla_layer.g_norm(o.float()) * F.silu(g.float())
    assert fused.dtype == torch.bfloat16 and rel_norm(fused, unfused) < 1e-2


if __name__ == "__main__":
    triton_interpreter.report(interpreter_opchecks)
