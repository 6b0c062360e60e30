"""Issue 19 on CUDA: the custom ops against fla's own autograd and the exact references, and a compiled LKAT
(torch.compile, fullgraph: no graph break) against eager, forward and backward, in fp32 and bf16.

A one-block LKAT-T at 224² (201 tokens: fla's chunk kernel and our short kernel take their real paths) keeps
inductor's compile time short; each GLA mode and KAN kernel path is compiled once.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from tolerance import rel_norm

import lkat_lens
from lkat_lens.kernels import gla_fla, rbf
from lkat_lens.kernels.gla import gla_recurrent

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def gla_inputs(dtype: torch.dtype, T: int = 201) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(T)
    q, k, v = (torch.randn(4, T, 3, 64, device="cuda", generator=gen) for _ in range(3))
    gk = F.logsigmoid(torch.randn(4, T, 3, 64, device="cuda", generator=gen)) / 16
    return [q.to(dtype), k.to(dtype), v.to(dtype), gk]  # gk in fp32, as VisionGLA gives it


def outputs_and_grads(fn, inputs: list[torch.Tensor], do: torch.Tensor) -> list[torch.Tensor]:
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    o = fn(*leaves)
    return [o.detach(), *torch.autograd.grad(o, leaves, do.to(o.dtype))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", gla_fla.MODES)
def test_fla_op_matches_fla_autograd_and_the_recurrence(mode, dtype):
    """The op's forward and backward (chunk: fla's A and gate cumsum kept from the forward, as fla keeps them) equal
    fla's own autograd function, and are as close to the fp64 recurrence as fla is."""
    if mode == "chunk" and dtype == torch.float32:
        pytest.skip("fla 0.6.0's chunk_gla faults on fp32 inputs (kernels/gla.py)")
    from fla.ops.gla import chunk_gla, fused_recurrent_gla

    inputs = gla_inputs(dtype)
    do = torch.randn_like(inputs[2], dtype=torch.float32)
    fla_fn = {
        "chunk": lambda q, k, v, g: chunk_gla(q, k, v, g, scale=0.125)[0],
        "fused_recurrent": lambda q, k, v, g: fused_recurrent_gla(q, k, v, gk=g, scale=0.125)[0],
    }[mode]
    ours = outputs_and_grads(lambda *x: gla_fla.fla_gla(*x, 0.125, mode), inputs, do)
    theirs = outputs_and_grads(fla_fn, inputs, do)
    truth = outputs_and_grads(lambda *x: gla_recurrent(*(t.double() for t in x), scale=0.125)[0], inputs, do)
    for name, a, b, t in zip(("o", "dq", "dk", "dv", "dgk"), ours, theirs, truth, strict=True):
        assert a.dtype == b.dtype or name == "o", name
        assert rel_norm(a, b) < (1e-6 if dtype == torch.float32 else 1e-2), (name, rel_norm(a, b))
        assert rel_norm(a, t) <= 1.5 * rel_norm(b, t) + 1e-6, (name, rel_norm(a, t), rel_norm(b, t))


def test_rbf_kernel_writes_bf16_exactly_as_a_cast():
    """The Triton RBF kernel with a bf16 output equals its fp32 output rounded to bf16, bit for bit."""
    x = torch.randn(1031, 203, device="cuda")
    weight = torch.randn(203, 4, device="cuda")
    y32 = rbf.rbf_grid_linear(x, weight, -2.0, 2.0, backend="triton")
    y16 = rbf.rbf_grid_linear(x, weight, -2.0, 2.0, backend="triton", out_dtype=torch.bfloat16)
    assert y16.dtype == torch.bfloat16 and torch.equal(y16, y32.to(torch.bfloat16))


@pytest.fixture(scope="module")
def lkat_setup():
    """A one-block LKAT-T whose KAN layers carry weight, a batch of 224² images and labels."""
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_tiny_patch16_224", num_classes=100, depth=1).cuda().train()
    for m in model.modules():  # reference init makes KAN outputs ~0; give them weight so they are tested
        if isinstance(m, lkat_lens.models.KANLayer):
            torch.nn.init.normal_(m.grid_linear.weight, std=0.5)
            torch.nn.init.normal_(m.dim_linear.weight, std=m.in_features**-0.5)
    x = torch.randn(4, 3, 224, 224, device="cuda")
    y = torch.randint(0, 100, (4,), device="cuda")
    return model, x, y


def step(model, x, y, dtype, compile_mode: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and the flat parameter gradient of one forward/backward (compiled with fullgraph when asked)."""
    run = model if compile_mode is None else torch.compile(model, mode=compile_mode, fullgraph=True)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        logits = run(x)
    F.cross_entropy(logits.float(), y).backward()
    grads = torch.cat([p.grad.detach().float().flatten() for p in model.parameters()])
    return logits.detach().float(), grads


@pytest.mark.parametrize(("attn", "kan"), [("chunk", "triton"), ("short", "fused"), ("chunk", "auto")])
def test_compiled_lkat_bf16_matches_eager(lkat_setup, attn, kan):
    """fullgraph compile (any graph break fails) in bf16: compiled logits and gradients are as close to the fp32
    eager model as eager bf16 is (inductor fuses the elementwise work in fp32, so the two bf16 runs differ)."""
    model, x, y = lkat_setup
    model = copy.deepcopy(model).set_backends(attn=attn, kan=kan)
    truth = step(model, x, y, torch.float32)
    eager = step(model, x, y, torch.bfloat16)
    compiled = step(model, x, y, torch.bfloat16, "default")
    errors = {
        name: (rel_norm(c, t), rel_norm(e, t))
        for name, c, e, t in zip(("logits", "grads"), compiled, eager, truth, strict=True)
    }
    print(f"bf16 attn={attn} kan={kan}: rel. error vs fp32 eager (compiled / eager) {errors}")
    for name, (compiled_err, eager_err) in errors.items():
        assert compiled_err <= 2 * eager_err + 1e-2, name
    torch.compiler.reset()


@pytest.mark.parametrize("kan", ["triton", "auto"])
def test_compiled_lkat_fp32_equals_eager(lkat_setup, kan):
    """In fp32 with TF32 off (cuDNN's too: it is on by default, and eager and inductor may run the patch
    embedding's convolution through different algorithms) the compiled model equals the eager one to fp32
    rounding; with kan="auto" the compiled model takes the traced KAN path, and with the GLA inputs through the
    modules (gla_input="torch") the shifted-tap convolutions."""
    model, x, y = lkat_setup
    model = copy.deepcopy(model).set_backends(attn="fused_recurrent", kan=kan, gla_input="torch")
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        eager = step(model, x, y, torch.float32)
        compiled = step(model, x, y, torch.float32, "default")
    errors = rel_norm(compiled[0], eager[0]), rel_norm(compiled[1], eager[1])
    print(f"fp32: rel. error compiled vs eager (logits, grads) {errors}")
    assert errors[0] < 1e-4 and errors[1] < 1e-3, errors
    torch.compiler.reset()


def test_cuda_graphs_lkat_bf16_matches_eager(lkat_setup):
    """mode="reduce-overhead" (CUDA graphs over the compiled graph, fla's and our kernels inside) in bf16: the third
    step's logits and gradients are as close to the fp32 eager model as eager bf16 is."""
    model, x, y = lkat_setup
    model = copy.deepcopy(model).set_backends(attn="chunk", kan="auto")
    truth = step(model, x, y, torch.float32)
    eager = step(model, x, y, torch.bfloat16)
    run = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):
        torch.compiler.cudagraph_mark_step_begin()
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = run(x)
        F.cross_entropy(logits.float(), y).backward()
    graphed = logits.detach().float().clone(), torch.cat([p.grad.float().flatten() for p in model.parameters()])
    errors = {
        name: (rel_norm(g, t), rel_norm(e, t))
        for name, g, e, t in zip(("logits", "grads"), graphed, eager, truth, strict=True)
    }
    print(f"bf16 CUDA graphs: rel. error vs fp32 eager (graphed / eager) {errors}")
    for name, (graphed_err, eager_err) in errors.items():
        assert graphed_err <= 2 * eager_err + 1e-2, name
    torch.compiler.reset()


def test_hooks_still_take_the_materialised_path_on_cuda(lkat_setup):
    """With hook_pattern hooked, the eager model builds the implicit attention (fp32) and passes it through the hook."""
    model, x, _ = lkat_setup
    model = copy.deepcopy(model).eval()
    seen = []
    attn = model.blocks[0].attn
    handle = attn.hook_pattern.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        hooked = model(x[:2]).float()
    handle.remove()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        plain = model(x[:2]).float()
    assert seen == [torch.Size([2, 3, 201, 201])]
    assert rel_norm(hooked, plain) < 3e-2
