"""kernels.tuned on CUDA: after a key's autotuning call and its call through JITFunction.run, TunedKernel starts the
compiled kernel directly, with the kernel's results, for every specialisation it meets (16-byte-aligned and
misaligned tensors, sizes of 1, 16, 17 and more, fp32 and bf16); and a model's kernels give the same values started
either way."""

from __future__ import annotations

import copy
import itertools
from unittest import mock

import pytest
import torch
import triton
import triton.language as tl
from tolerance import rel_norm
from triton.runtime.jit import JITFunction

import lkat_lens
from lkat_lens.kernels import tuned
from lkat_lens.kernels.tuned import TunedKernel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@triton.jit
def _axpy(x_ptr, y_ptr, out_ptr, n, alpha, SCALE_Y: tl.constexpr, BLOCK: tl.constexpr):
    """out = alpha x + SCALE_Y y over n elements."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=offs < n).to(tl.float32)
    tl.store(out_ptr + offs, (alpha * x + SCALE_Y * y).to(out_ptr.dtype.element_ty), mask=offs < n)


def _operands(n: int, dtype: torch.dtype, offset: int) -> tuple[torch.Tensor, ...]:
    """x, y, out of n elements whose data start `offset` elements into their storage."""
    gen = torch.Generator(device="cuda").manual_seed(n + offset)
    x, y = (torch.randn(n + offset, device="cuda", generator=gen).to(dtype)[offset:] for _ in range(2))
    return x, y, torch.full((n + offset,), float("nan"), device="cuda", dtype=dtype)[offset:]


def test_direct_launches_compute_the_kernels_result_for_every_specialisation() -> None:
    kernel = TunedKernel(
        triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((64, 2), (256, 4))], key=["n"])(
            _axpy
        )
    )
    jit_calls = []
    original = JITFunction.run

    def counted(self, *args, **kwargs):
        jit_calls.append(self)
        return original(self, *args, **kwargs)

    cases = list(itertools.product((1, 16, 17, 1000), (torch.float32, torch.bfloat16), (0, 1)))
    with mock.patch.object(JITFunction, "run", counted):
        for n, dtype, offset in cases * 4:
            x, y, out = _operands(n, dtype, offset)
            kernel[lambda m, n=n: (triton.cdiv(n, m["BLOCK"]),)](x, y, out, n, 0.5, SCALE_Y=2.0)
            expected = (0.5 * x.float() + 2.0 * y.float()).to(dtype)
            assert torch.equal(out, expected), (n, dtype, offset)
        before = len(jit_calls)
        for n, dtype, offset in cases:  # every key seen three times already: started directly
            x, y, out = _operands(n, dtype, offset)
            kernel[lambda m, n=n: (triton.cdiv(n, m["BLOCK"]),)](x, y, out, n, 0.5, SCALE_Y=2.0)
            assert torch.equal(out, (0.5 * x.float() + 2.0 * y.float()).to(dtype)), (n, dtype, offset)
    assert len(jit_calls) == before and len(kernel._plans) == len(cases)


def test_lkat_step_gives_the_same_values_started_directly_and_through_triton() -> None:
    """A two-block LKAT-T training step under bf16 autocast (the GLA input path, short GLA, output path and KAN
    kernels all autotuned): logits and every gradient the same with DIRECT on and off (to 1e-6 of their norm: the
    same kernels run, so only a library's own run-to-run differences may show)."""
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_tiny_patch16_224", num_classes=10, depth=2).cuda()
    images = torch.randn(8, 3, 224, 224, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))

    def step(direct: bool) -> list[torch.Tensor]:
        tuned.DIRECT = direct
        net = copy.deepcopy(model)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = net(images).float()
        logits.square().sum().backward()
        return [logits.detach(), *(p.grad for p in net.parameters() if p.grad is not None)]

    try:
        for _ in range(3):  # autotune, then through JITFunction.run, then direct
            step(True)
        direct, jit = step(True), step(False)
    finally:
        tuned.DIRECT = True
    assert len(direct) == len(jit) > 10
    assert max(rel_norm(a, b) for a, b in zip(direct, jit, strict=True)) < 1e-6


def test_launch_hooks_see_every_direct_launch() -> None:
    """With a hook in Triton's launch enter chain, direct launches call it with the launch metadata (a LazyDict whose
    get() holds the kernel's name), as Triton's own launches do; with the chains empty again, launches call none."""
    kernel = TunedKernel(triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["n"])(_axpy))
    seen = []

    def hook(metadata) -> None:
        seen.append(metadata.get()["name"])

    x, y, out = _operands(1000, torch.float32, 0)
    grid = lambda m: (triton.cdiv(1000, m["BLOCK"]),)  # noqa: E731
    for _ in range(3):  # autotune, then through JITFunction.run: the plan exists from here on
        kernel[grid](x, y, out, 1000, 0.5, SCALE_Y=2.0)
    assert len(kernel._plans) == 1
    triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        kernel[grid](x, y, out, 1000, 0.5, SCALE_Y=2.0)
        kernel[grid](x, y, out, 1000, 0.5, SCALE_Y=2.0)
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    kernel[grid](x, y, out, 1000, 0.5, SCALE_Y=2.0)
    torch.cuda.synchronize()
    assert seen == ["_axpy", "_axpy"], seen
    assert torch.equal(out, 0.5 * x + 2.0 * y)
