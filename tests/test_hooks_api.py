"""TransformerLens conventions on every lkat-lens model: run_with_cache(names_filter=, incl_bwd=), run_with_hooks,
and an ActivationCache with TL's names, each checked against plain torch forward hooks and autograd."""

from __future__ import annotations

import pytest
import torch
from tolerance import assert_close


def captured(model, images, module) -> torch.Tensor:
    """The output of `module` in a forward pass, read by a plain torch forward hook."""
    seen = []
    handle = module.register_forward_hook(lambda m, args, out: seen.append(out.detach()))
    with torch.no_grad():
        model(images)
    handle.remove()
    return seen[0]


def test_tl_names_read_the_modules_outputs(lkat, images):
    _, cache = lkat.run_with_cache(
        images, names_filter=lambda n: "hook_resid" in n or n.endswith(("attn.hook_out", "hook_q"))
    )
    blocks = len(lkat.blocks)
    for b in range(blocks):
        assert torch.equal(cache["resid_post", b], captured(lkat, images, lkat.blocks[b]))
        assert torch.equal(cache["attn_out", b], cache[f"blocks.{b}.attn.hook_out"])
        assert torch.equal(cache["q", b], cache["hook_q", b])
    assert torch.equal(cache["resid_post", -1], cache["resid_post", blocks - 1])
    assert torch.equal(cache["resid_pre", 1], cache["resid_post", 0])
    stacked = cache.stack_activation("resid_post")
    assert stacked.shape[0] == blocks and torch.equal(stacked[2], cache["resid_post", 2])
    assert cache.stack_activation("q", layer=2).shape[0] == 2
    resid = cache.accumulated_resid()
    assert resid.shape[0] == blocks + 1 and torch.equal(resid[-1], cache["resid_post", -1])
    assert cache.accumulated_resid(layer=2, incl_mid=True).shape[0] == 4
    assert "blocks.0.hook_resid_post" in repr(cache)


def test_incl_bwd_caches_the_gradients_autograd_gives(lkat, images):
    label = 3
    _, cache = lkat.run_with_cache(
        images, names_filter="blocks.1.hook_resid_post", incl_bwd=True, metric=lambda logits: logits[:, label].sum()
    )
    assert set(cache) == {"blocks.1.hook_resid_post", "blocks.1.hook_resid_post_grad"}
    kept = []  # the same gradient, independently: a plain hook keeps the tensor, autograd differentiates to it
    handle = lkat.blocks[1].register_forward_hook(lambda m, args, out: kept.append(out))
    logits = lkat(images)
    handle.remove()
    (want,) = torch.autograd.grad(logits[:, label].sum(), kept[0])
    assert_close(cache["resid_post_grad", 1], want)
    with pytest.raises(ValueError, match="incl_bwd needs a scalar"):
        lkat.run_with_cache(images, names_filter="hook_final", incl_bwd=True)


def test_run_with_hooks_patches_like_a_torch_hook_and_cleans_up(lkat, images):
    zero = lambda tensor, hook: torch.zeros_like(tensor)  # noqa: E731
    patched = lkat.run_with_hooks(images, fwd_hooks=[("blocks.2.hook_resid_post", zero)])
    handle = lkat.blocks[2].register_forward_hook(lambda m, args, out: torch.zeros_like(out))
    with torch.no_grad():
        want = lkat(images)
    handle.remove()
    assert_close(patched, want)
    assert not any(p._forward_hooks for p in lkat.hook_points().values())  # nothing left attached
    with torch.no_grad():
        assert not torch.equal(lkat(images), want)


def test_remove_batch_dim_and_bad_names(lkat, images):
    _, cache = lkat.run_with_cache(images[:1], names_filter="hook_final", remove_batch_dim=True)
    assert cache["hook_final"].dim() == 2 and not cache.has_batch_dim
    _, two = lkat.run_with_cache(images, names_filter="hook_final")
    with pytest.raises(ValueError, match="needs a batch of one"):
        two.remove_batch_dim()
    with pytest.raises(KeyError, match=r"model.list_hooks\(\)"):
        lkat.run_with_cache(images, names_filter=["blocks.0.hook_nothing"])
    with pytest.raises(KeyError, match="no hook 'nothing' in block 0"):
        two["nothing", 0]
