"""The eager GLA core and KAN MLP replayed as CUDA graphs (kernels/graphed.py, VisionGLA.eager_graphs,
KAN.eager_graphs) against the same model with their kernels launched one by one: training steps, a second forward
before a backward, inference outputs kept across calls, and a retained graph whose saved tensors a later forward
overwrote."""

from __future__ import annotations

import copy

import pytest
import torch
from model_paths import lkat_t_and_images
from tolerance import rel_norm

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# the same kernels with the same operands; some of them sum weight-gradient partials with fp32 atomics, in an order
# that differs between launches, and AdamW carries such differences into the next steps' bf16 roundings: a bound
# well below the bf16 model's own error against fp32 (~1e-2)
BOUND = 2e-3


def models() -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor]:
    """Two copies of a two-block LKAT-T on the short GLA and the KAN layers' "triton" path (which the graphed MLP
    takes), with and without eager graphs, and a batch of 4 images."""
    model, images = lkat_t_and_images()
    model.set_backends(attn="auto", kan="triton")
    plain = copy.deepcopy(model).set_backends(eager_graphs=False)
    return model.set_backends(eager_graphs=True), plain, images


def flat_grad(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter's gradient, flattened into one fp64 vector."""
    return torch.cat([p.grad.double().flatten() for p in model.parameters() if p.grad is not None])


def step(model: torch.nn.Module, images: torch.Tensor, opt: torch.optim.Optimizer) -> tuple[torch.Tensor, torch.Tensor]:
    """One bf16-autocast training step on the logits' squares: the loss and the gradients before the update."""
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(images).float().square().mean()
    loss.backward()
    grads = flat_grad(model)
    opt.step()
    return loss.detach(), grads


def captures(model: torch.nn.Module) -> list[tuple[int, int, int, int]]:
    """Per GLA layer and KAN MLP (each block's attn and mlp): its captures of the forward with gradients, without
    them and of the backward, and the first forward capture's replays."""
    counts = []
    for layer in (m for b in model.blocks for m in (b.attn, b.mlp)):
        graphs = layer._graphs
        forward = list(graphs.forward.captures.values())
        replays = forward[0].replays if forward else 0
        counts.append((len(forward), len(graphs.inference.captures), len(graphs.backward.captures), replays))
    return counts


def test_graphed_core_and_mlp_train_as_the_plain_ones() -> None:
    """Five AdamW steps of both models from the same weights: the same losses and gradients at every step, and each
    layer captured its forward at the second step and its backward at the third, then replayed them."""
    graphed, plain, images = models()
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (graphed, plain)]
    for i in range(5):
        (loss, grads), (loss_ref, grads_ref) = (step(m, images, o) for m, o in zip((graphed, plain), opts, strict=True))
        assert rel_norm(loss, loss_ref) <= BOUND, (i, loss, loss_ref)
        assert rel_norm(grads, grads_ref) <= BOUND, (i, rel_norm(grads, grads_ref))
    assert captures(graphed) == [(1, 0, 1, 4)] * 4, captures(graphed)
    assert captures(plain) == [(0, 0, 0, 0)] * 4


def test_a_second_forward_before_the_backward_runs_uncaptured() -> None:
    """Once captured, two forwards of different images and one backward of both: the second forward finds the
    layer's capture claimed and runs its kernels one by one; the gradients are the plain model's."""
    graphed, plain, images = models()
    opts = [torch.optim.SGD(m.parameters(), lr=0.0) for m in (graphed, plain)]
    for _ in range(3):
        for m, o in zip((graphed, plain), opts, strict=True):
            step(m, images, o)
    others = images.flip(0)
    grads = []
    for m in (graphed, plain):
        m.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(images).float().square().mean() + m(others).float().pow(3).mean()
        loss.backward()
        grads.append(flat_grad(m))
    assert rel_norm(*grads) <= BOUND, rel_norm(*grads)
    assert captures(graphed) == [(1, 0, 1, 3)] * 4, captures(graphed)  # the second forward claimed nothing


def test_inference_outputs_outlive_the_next_call() -> None:
    """Under no_grad, once captured, logits of two batches kept side by side: each the plain model's for its batch."""
    graphed, plain, images = models()
    batches = [images, images.flip(0), images * 0.5]
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        got = [graphed(b).float() for b in batches]
        want = [plain(b).float() for b in batches]
    for g, w in zip(got, want, strict=True):
        assert rel_norm(g, w) <= BOUND
    assert captures(graphed) == [(0, 1, 0, 0)] * 4


def test_a_retained_graph_after_a_later_forward_fails_clearly() -> None:
    """A second backward through a graph kept with retain_graph=True works while no other forward replayed the layer,
    and raises, naming the setting, after one did."""
    graphed, _, images = models()
    opt = torch.optim.SGD(graphed.parameters(), lr=0.0)
    for _ in range(3):
        step(graphed, images, opt)
    graphed.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = graphed(images).float().square().mean()
    loss.backward(retain_graph=True)
    first = flat_grad(graphed)
    graphed.zero_grad(set_to_none=True)
    loss.backward(retain_graph=True)
    assert rel_norm(flat_grad(graphed), first) <= BOUND
    with torch.autocast("cuda", dtype=torch.bfloat16):
        graphed(images.flip(0)).float().sum().backward()
    with pytest.raises(RuntimeError, match="eager_graphs=False"):
        loss.backward()


def test_a_copied_model_starts_without_captures() -> None:
    """deepcopy of a model whose layers hold captures: the copy holds none and trains as the original."""
    graphed, _, images = models()
    opt = torch.optim.SGD(graphed.parameters(), lr=0.0)
    for _ in range(3):
        step(graphed, images, opt)
    copied = copy.deepcopy(graphed)
    assert captures(copied) == [(0, 0, 0, 0)] * 4
    loss, _ = step(copied, images, torch.optim.SGD(copied.parameters(), lr=0.0))
    loss_ref, _ = step(graphed, images, opt)
    assert rel_norm(loss, loss_ref) <= BOUND


def test_a_model_run_in_inference_mode_then_trains() -> None:
    """Captured under torch.inference_mode, then trained: the training steps capture their own and give the plain
    model's gradients (autograd cannot save inference tensors: RoPE's tables built under inference mode are built
    again outside it)."""
    graphed, plain, images = models()
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        for _ in range(2):
            graphed(images)
    assert captures(graphed) == [(0, 1, 0, 0)] * 4
    opts = [torch.optim.SGD(m.parameters(), lr=0.0) for m in (graphed, plain)]
    for _ in range(3):
        (_, grads), (_, grads_ref) = (step(m, images, o) for m, o in zip((graphed, plain), opts, strict=True))
        assert rel_norm(grads, grads_ref) <= BOUND
    assert captures(graphed) == [(1, 1, 1, 2)] * 4


def test_two_models_stepped_in_turn() -> None:
    """Two graphed models in steps that run both forwards before both backwards: each model's gradients are its plain
    copy's, and both replay their captures from the second step on."""
    first, first_plain, images = models()
    second, second_plain = copy.deepcopy(first), copy.deepcopy(first_plain)
    others = images.flip(0)
    for i in range(4):
        grads = []
        for pair in ((first, second), (first_plain, second_plain)):
            for m in pair:
                m.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                losses = [m(x).float().square().mean() for m, x in zip(pair, (images, others), strict=True)]
            for loss in losses:
                loss.backward()
            grads.append([flat_grad(m) for m in pair])
        for got, want in zip(*grads, strict=True):
            assert rel_norm(got, want) <= BOUND, (i, rel_norm(got, want))
    assert captures(first) == captures(second) == [(1, 0, 1, 3)] * 4, (captures(first), captures(second))
