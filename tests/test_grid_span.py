"""The share of the RBF grid a KAN layer's inputs occupy, against numpy and against inputs captured by plain
torch forward hooks."""

import numpy as np
import pytest
import torch

from lkat_lens.analyses.grid_span import SLIVER, grid_span_share, is_sliver, layer_span_shares
from lkat_lens.analyses.parts import kan_layers


def test_grid_span_share_against_numpy():
    rng = np.random.default_rng(0)
    x = np.stack([rng.normal(0, 0.5, 4000), rng.uniform(-5, 5, 4000), np.full(4000, 0.3), rng.normal(3, 0.1, 4000)])
    expected = []
    for channel in x:  # share of [-2, 2] inside the channel's [1 %, 99 %] quantile range
        lo, hi = np.quantile(channel, [0.01, 0.99])
        expected.append(max(0.0, min(hi, 2.0) - max(lo, -2.0)) / 4.0)
    got = grid_span_share(torch.tensor(x.T), -2.0, 2.0)
    assert got == pytest.approx(float(np.mean(expected)), rel=1e-9)
    assert expected[1] == pytest.approx(1.0) and expected[2] == 0.0 and expected[3] == 0.0


def test_layer_span_shares_read_each_layers_inputs(lkat, images):
    """Every KAN layer's share equals grid_span_share of the inputs a plain torch hook on the layer saw (after its
    layer norm when it has one: the hook point sits there)."""
    seen, handles = {}, []
    for name, layer in kan_layers(lkat).items():
        target = layer.layernorm if layer.layernorm is not None else layer
        keep_output = layer.layernorm is not None

        def save(module, args, output, name=name, keep_output=keep_output):
            seen[name] = (output if keep_output else args[0]).detach()

        handles.append(target.register_forward_hook(save))
    with torch.no_grad():
        lkat(images)
    for handle in handles:
        handle.remove()
    shares = layer_span_shares(lkat, images)
    assert list(shares) == list(seen) and len(shares) == 2 * len(lkat.blocks)
    for name, layer in kan_layers(lkat).items():
        assert shares[name] == grid_span_share(seen[name], layer.rbf.grid_min, layer.rbf.grid_max)


def test_a_layer_fed_one_point_is_a_sliver():
    x = torch.full((50, 3), 0.25) + 5e-9 * torch.randn(50, 3, generator=torch.Generator().manual_seed(0))
    assert grid_span_share(x, -2.0, 2.0) < 1e-8 and is_sliver(grid_span_share(x, -2.0, 2.0))
    assert not is_sliver(SLIVER)


def test_layer_span_shares_stream_over_the_first_images(lkat):
    images = torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    assert layer_span_shares(lkat, images, batch_size=2) == pytest.approx(layer_span_shares(lkat, images), rel=1e-9)
    assert layer_span_shares(lkat, images, batch_size=2, max_images=3) == layer_span_shares(lkat, images[:3])
