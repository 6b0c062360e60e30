"""kernels/graphed.py without a GPU: what keys a capture, a key's first call run as it is, captures that a copied or
pickled model does not carry, and the input copies read-at-once captures share (tests/gpu/test_eager_graphs_gpu.py
replays them on CUDA)."""

from __future__ import annotations

import copy
import pickle

import torch

import lkat_lens
from lkat_lens.kernels import graphed
from lkat_lens.kernels.gla_core import gla_core_fwd
from lkat_lens.kernels.graphed import GraphedCalls, call_key
from lkat_lens.kernels.kan_linear import kan_pair_fwd


def test_a_key_holds_the_pointers_of_what_stays_in_place() -> None:
    """A moving tensor is keyed by its layout alone, the others by their data pointer too; lists become tuples."""
    weight, x, other_x = torch.randn(4, 3), torch.randn(2, 3), torch.randn(2, 3)
    key = call_key((x, weight, [1e-6, 2e-6], 3), frozenset({0}))
    assert key == call_key((other_x, weight, [1e-6, 2e-6], 3), frozenset({0}))
    assert key != call_key((x, weight.clone(), [1e-6, 2e-6], 3), frozenset({0}))
    assert key != call_key((x.t().contiguous().t(), weight, [1e-6, 2e-6], 3), frozenset({0}))  # other strides
    assert key != call_key((x, weight, [1e-6, 2e-6], 4), frozenset({0}))
    assert key[2] == (1e-6, 2e-6)
    hash(key)


def test_a_keys_first_call_runs_the_function_as_it_is() -> None:
    """The first call of a key runs fn and captures nothing (its kernels tune and compile; a shape run once is never
    captured)."""
    calls = []

    def fn(x, w):
        calls.append(x)
        return (x @ w.T,)

    graphed = GraphedCalls(fn, [0], read_at_once=True)
    x, w = torch.randn(2, 3), torch.randn(4, 3)
    assert graphed.capture_for((x, w)) is None
    (out,) = graphed(torch.randn(5, 3), w)  # another shape: its own first call
    assert out.shape == (5, 4) and len(calls) == 1
    assert not graphed.captures and len(graphed.seen) == 2


def test_models_copied_or_pickled_start_without_captures() -> None:
    """A model's captures (plain attributes of its GLA layers and KAN MLPs) are not copied or pickled with it;
    eager graphs are off until set_backends turns them on."""
    model = lkat_lens.create_model("lkat_micro", num_classes=3)
    assert not any(b.attn.eager_graphs or b.mlp.eager_graphs for b in model.blocks)  # opt-in
    graphs = model.blocks[0].attn._graphs
    graphs.forward.seen.add(("a key",))
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        fresh = copied.blocks[0].attn._graphs
        assert fresh.forward is not graphs.forward and not fresh.forward.seen
        assert fresh.forward.fn is gla_core_fwd and fresh.backward.moving == frozenset({18})
        assert (fresh.inference.read_at_once, fresh.inference.keep, fresh.forward.read_at_once) == (True, 1, False)
        assert copied.blocks[0].mlp._graphs.forward.fn is kan_pair_fwd
    off = model.set_backends(eager_graphs=False).blocks
    assert not any(b.attn.eager_graphs or b.mlp.eager_graphs for b in off)
    assert all(b.attn.eager_graphs and b.mlp.eager_graphs for b in model.set_backends(eager_graphs=True).blocks)


def test_read_at_once_captures_share_one_input_copy_per_layout_while_held() -> None:
    """The copy a read-at-once capture's moving input goes into is one per layout (and inference mode), holds the
    input's values, and is freed when nothing holds it any more (weakly kept)."""
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    first = graphed._shared_input(x)
    assert torch.equal(first, x) and first.data_ptr() != x.data_ptr()
    second = graphed._shared_input(y)
    assert second is first and torch.equal(first, y)  # the same buffer, now y's values
    assert graphed._shared_input(torch.randn(3, 4)) is not first  # another layout
    with torch.inference_mode():
        inside = graphed._shared_input(x)
    assert inside is not first and inside.is_inference() and not first.is_inference()
    layout = (x.shape, x.stride(), x.dtype, x.device, False)
    del first, second
    assert layout not in graphed._SHARED_INPUTS
