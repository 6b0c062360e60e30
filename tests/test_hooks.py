"""Hook points: names, shapes, no-op hooks, run_with_cache, hooks() context manager, the GLA attention pattern."""

import copy

import pytest
import torch
import torch.nn.functional as F
from tolerance import assert_close

import lkat_lens

B, IMG, PATCH, D, H, DEPTH, R = 2, 16, 4, 64, 2, 4, 4
T = (IMG // PATCH) ** 2 + R + 1
DH = D // H


def design_hook_shapes(depth: int) -> dict[str, tuple[int, ...]]:
    """Every hook name of the README (Hook points) with its documented shape for lkat_micro."""
    shapes = {"hook_embed": (B, T, D), "hook_final": (B, T, D)}
    for i in range(depth):
        p = f"blocks.{i}."
        shapes |= {p + n: (B, T, D) for n in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "attn.hook_out")}
        shapes |= {p + f"attn.hook_{n}": (B, T, H, DH) for n in ("q", "k", "v", "gk", "z")}
        shapes[p + "attn.hook_pattern"] = (B, H, T, T)
        shapes |= {p + "mlp.fc1.hook_in": (B, T, D), p + "mlp.fc1.hook_out": (B, T, 4 * D)}
        shapes |= {p + "mlp.fc2.hook_in": (B, T, 4 * D), p + "mlp.fc2.hook_out": (B, T, D)}
    return shapes


def test_list_hooks_is_exactly_the_design(lkat):
    assert set(lkat.list_hooks()) == set(design_hook_shapes(DEPTH))


def test_run_with_cache_returns_every_hook_with_documented_shape(lkat, images):
    logits, cache = lkat.run_with_cache(images)
    expected = design_hook_shapes(DEPTH)
    assert {k: tuple(v.shape) for k, v in cache.items()} == expected
    assert_close(logits, lkat(images), rtol=0, atol=1e-5)  # hook_pattern: explicit A @ v
    assert all(not v.requires_grad for v in cache.values())
    gk = cache["hook_gk", 2]
    assert (gk < 0).all()
    assert_close(cache["hook_final"][:, -1] @ lkat.head.weight.T + lkat.head.bias, logits)


def test_noop_hooks_give_bit_identical_logits(lkat, images):
    plain = lkat(images)
    with lkat.hooks(fwd_hooks=[(lambda n: not n.endswith("hook_pattern"), lambda t, hook: None)]):
        hooked = lkat(images)
    assert torch.equal(plain, hooked)


def test_read_only_pattern_hook_keeps_logits(lkat, images):
    plain = lkat(images)
    with lkat.hooks(fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda t, hook: None)]):
        hooked = lkat(images)
    assert_close(hooked, plain, rtol=0, atol=1e-5)


def test_pattern_is_used_replaced_or_edited_and_gets_gradients(lkat, images):
    lkat = copy.deepcopy(lkat)
    attn = lkat.blocks[1].attn
    with torch.no_grad():
        attn.g_norm.bias.normal_()  # so that g_norm(0) = bias is not zero
    _, cache = lkat.run_with_cache(images, names="blocks.1.")
    assert torch.all(cache["blocks.1.attn.hook_pattern"].triu(1) == 0)
    gate = F.silu(attn.g_proj(lkat.blocks[1].norm1(cache["blocks.1.hook_resid_pre"])))
    want = attn.o_proj(attn.g_norm(torch.zeros(B, T, H, DH)).flatten(-2) * gate)  # g_norm(0) is its bias
    assert want.abs().max() > 0.1

    def edit_in_place(pattern, hook):
        pattern.zero_()

    for fn in (lambda p, hook: torch.zeros_like(p), edit_in_place):
        with lkat.hooks(fwd_hooks=[("blocks.1.attn.hook_pattern", fn)]):
            _, patched = lkat.run_with_cache(images, names="blocks.1.attn.hook_out")
        assert_close(patched["blocks.1.attn.hook_out"], want, rtol=0, atol=1e-6)
    logits, cache = lkat.run_with_cache(images, names="blocks.1.attn.hook_pattern", grad=True)
    (grad,) = torch.autograd.grad(logits[:, 0].sum(), cache["blocks.1.attn.hook_pattern"])
    assert grad.shape == (B, H, T, T) and grad.abs().sum() > 0


def test_cache_indexing_by_short_name(lkat, images):
    _, cache = lkat.run_with_cache(images, names="blocks.1.")
    assert cache["hook_q", 1] is cache["blocks.1.attn.hook_q"]
    assert cache["fc2.hook_in", 1] is cache["blocks.1.mlp.fc2.hook_in"]
    assert cache["resid_post", 1] is cache["blocks.1.hook_resid_post"]
    with pytest.raises(KeyError, match="ambiguous"):
        cache["hook_in", 1]
    with pytest.raises(KeyError):
        cache["hook_q", 0]  # block 0 was not selected


def test_names_as_list_prefix_or_predicate(lkat, images):
    _, by_list = lkat.run_with_cache(images, names=["hook_embed", "blocks.0.attn.hook_gk"])
    assert list(by_list) == ["hook_embed", "blocks.0.attn.hook_gk"]
    _, by_pred = lkat.run_with_cache(images, names=lambda n: n.endswith("hook_v"))
    assert len(by_pred) == DEPTH
    with pytest.raises(KeyError, match="list_hooks"):
        lkat.run_with_cache(images, names=["blocks.0.hook_nope"])


def test_cache_device_and_grad(lkat, images):
    _, cache = lkat.run_with_cache(images, names="hook_final", device="meta")
    assert cache["hook_final"].device.type == "meta"
    assert next(lkat.parameters()).device.type == "cpu"
    logits, cache = lkat.run_with_cache(images, names="blocks.0.hook_resid_post", grad=True)
    act = cache["blocks.0.hook_resid_post"]
    (grad,) = torch.autograd.grad(logits[:, 0].sum(), act)
    assert grad.shape == act.shape and grad.abs().sum() > 0


def test_patching_hook_changes_output_and_is_removed_after_exception(lkat, images):
    plain = lkat(images)
    with pytest.raises(RuntimeError, match="boom"):
        with lkat.hooks(fwd_hooks=[("blocks.3.hook_resid_post", lambda t, hook: torch.zeros_like(t))]):
            zeroed = lkat(images)
            raise RuntimeError("boom")
    expected = lkat.head(lkat.norm(torch.zeros(B, D)))
    assert_close(zeroed, expected)
    assert not any(p.active for p in lkat.hook_points().values())
    assert torch.equal(lkat(images), plain)


def test_backward_hooks_see_gradients(lkat, images):
    seen = {}
    x = images.clone().requires_grad_(True)

    def record(grad, hook):
        seen[hook.name] = tuple(grad.shape)

    with lkat.hooks(bwd_hooks=[("blocks.0.attn.hook_gk", record)]):
        lkat(x).sum().backward()
    assert seen == {"blocks.0.attn.hook_gk": (B, T, H, DH)}


def test_rbfkat_attention_pattern_hook(images):
    torch.manual_seed(0)
    model = lkat_lens.create_model("rbfkat_tiny_patch16_224", num_classes=10, img_size=16, patch_size=4).eval()
    plain = model(images)
    logits, cache = model.run_with_cache(images, names=lambda n: n.endswith("hook_pattern"))
    pattern = cache["hook_pattern", 0]
    assert pattern.shape == (B, 3, T, T)
    assert_close(pattern.sum(-1), torch.ones(B, 3, T))
    assert_close(logits, plain, rtol=1e-4, atol=1e-5)
