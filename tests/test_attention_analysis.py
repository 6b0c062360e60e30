"""Attention analyses: GLA implicit attention reproduces the layer, class-token rows, rollout, attention gradients."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from tolerance import assert_close

import lkat_lens
from lkat_lens.analyses.attention import (
    attention_gradients,
    attention_matrices,
    attention_rollout,
    cls_attention,
    rollout,
)
from lkat_lens.kernels.gla import gated_linear_attention, implicit_attention
from lkat_lens.models import RbfKAT

B, IMG = 2, 16
PATTERNS = lambda name: name.endswith("hook_pattern")  # noqa: E731


@pytest.fixture(scope="module")
def rbfkat():
    torch.manual_seed(1)
    return RbfKAT(img_size=IMG, patch_size=4, embed_dim=64, depth=2, num_heads=2, num_classes=10).eval()


@pytest.fixture(scope="module")
def vit5():
    torch.manual_seed(2)
    return lkat_lens.create_model("vit5_micro", num_classes=10, depth=2).eval()


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(3)
    return lkat_lens.create_model("vit_tiny_patch16_224", num_classes=10, img_size=IMG, patch_size=4, depth=2).eval()


def heads_first(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)


def test_implicit_attention_times_v_is_the_gla_layer_output(lkat, images):
    mats = attention_matrices(lkat, images)
    assert mats.kinds == ["gla"] * 4 and mats.matrices.shape == (4, B, 2, 21, 21)
    _, cache = lkat.run_with_cache(images, names=lambda n: not PATTERNS(n))  # the fused forward
    for i, block in enumerate(lkat.blocks):
        attn = block.attn
        q, k, v, gk = (cache[f"hook_{n}", i] for n in ("q", "k", "v", "gk"))
        assert_close(mats.matrices[i], implicit_attention(q, k, gk, scale=attn.scale), rtol=0, atol=1e-5)
        o = heads_first(mats.matrices[i] @ heads_first(v))
        assert_close(o, gated_linear_attention(q, k, v, gk, scale=attn.scale), rtol=0, atol=1e-5)
        # the rest of the layer (output norm, swish gate, o_proj) turns A @ v into the layer's own hook_out
        x = block.norm1(cache["hook_resid_pre", i])
        out = attn.o_proj(attn.g_norm(o).flatten(-2) * F.silu(attn.g_proj(x)))
        assert_close(out, cache["attn.hook_out", i], rtol=0, atol=1e-5)
        assert torch.all(mats.matrices[i].triu(1) == 0)


def test_cls_row_is_the_last_row_for_lkat(lkat, images):
    mats = attention_matrices(lkat, images, blocks=[1, 3])
    rows = cls_attention(lkat, images, blocks=[1, 3])
    assert mats.cls_index == 20 and rows.blocks == [1, 3]
    assert_close(rows.rows, mats.matrices[..., -1, :], rtol=0, atol=1e-6)
    assert rows.patch_maps.shape == (2, B, 2, 4, 4)
    assert torch.equal(rows.patch_maps[:, :, :, 2, 3], rows.rows[..., 2 * 4 + 3])
    assert torch.equal(rows.registers, rows.rows[..., 16:20])
    assert torch.equal(rows.self_weight, rows.rows[..., 20])
    json.dumps(rows.to_dict(), allow_nan=False)
    json.dumps(mats.to_dict(), allow_nan=False)


@pytest.mark.parametrize("name", ["rbfkat", "vit5", "vit"])
def test_softmax_patterns_rows_sum_to_one_and_cls_rows_follow_the_layout(name, request, images):
    model = request.getfixturevalue(name)
    mats = attention_matrices(model, images)
    rows = cls_attention(model, images)
    assert set(mats.kinds) == {"softmax"}
    assert_close(mats.matrices.sum(-1), torch.ones(mats.matrices.shape[:-1]))
    cls = {"rbfkat": 20, "vit5": 0, "vit": 0}[name]
    assert mats.cls_index == cls
    assert torch.equal(rows.rows, mats.matrices[..., cls, :])
    patches = model.token_layout["patches"]
    assert torch.equal(rows.patch_maps.flatten(-2), mats.matrices[..., cls, patches])


def test_rollout_hand_computation_and_identity():
    a1 = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    a2 = torch.tensor([[0.5, 0.5], [0.0, 1.0]])
    # M1 = rownorm(I + A1) = [[1, 0], [.25, .75]], M2 = rownorm(I + A2) = [[.75, .25], [0, 1]], rollout = M2 M1
    joint = rollout(torch.stack([a1, a2])[:, None, None])
    assert_close(joint[0], torch.tensor([[0.8125, 0.1875], [0.25, 0.75]]), rtol=0, atol=1e-7)
    eye = torch.eye(5).expand(3, 2, 4, 5, 5)
    assert torch.equal(rollout(eye), torch.eye(5).expand(2, 5, 5))
    signed = torch.randn(3, 2, 4, 5, 5, generator=torch.Generator().manual_seed(0))
    assert_close(rollout(signed).sum(-1), torch.ones(2, 5))
    grads = torch.randn(3, 2, 4, 5, 5, generator=torch.Generator().manual_seed(1))
    assert_close(rollout(signed, grads).sum(-1), torch.ones(2, 5))


def test_softmax_rollout_matches_hand_computation_on_two_layers(vit, images):
    result = attention_rollout(vit, images)
    _, cache = vit.run_with_cache(images, names=PATTERNS)
    p1, p2 = (cache["hook_pattern", i].mean(1) for i in range(2))
    eye = torch.eye(p1.shape[-1])
    m1, m2 = (eye + p1) / 2, (eye + p2) / 2  # softmax rows sum to 1, so rows of I + P sum to 2
    assert_close(result.joint, m2 @ m1)
    assert result.method == "attention" and result.target is None
    assert torch.equal(result.cls_map.flatten(-2), result.joint[:, 0, 1:])
    json.dumps(result.to_dict(), allow_nan=False)


def test_rollout_of_identity_attention_layers_is_the_identity(lkat, vit, images):
    dk = lkat.blocks[0].attn.head_dim
    unit = torch.zeros(dk)
    unit[0] = dk**0.25  # q = k = unit gives scale * q.k = 1 on the diagonal
    forget_all = [
        (lambda n: n.endswith("hook_gk"), lambda gk, hook: torch.full_like(gk, -1e4)),
        (lambda n: n.endswith(("hook_q", "hook_k")), lambda x, hook: unit.expand_as(x)),
    ]
    with lkat.hooks(fwd_hooks=forget_all):
        mats = attention_matrices(lkat, images)
        joint = attention_rollout(lkat, images).joint
    assert_close(mats.matrices, torch.eye(21).expand_as(mats.matrices))
    assert_close(joint, torch.eye(21).expand(B, 21, 21))
    with vit.hooks(fwd_hooks=[(PATTERNS, lambda p, hook: torch.eye(17).expand_as(p))]):
        joint = attention_rollout(vit, images).joint
    assert torch.equal(joint, torch.eye(17).expand(B, 17, 17))


@pytest.mark.parametrize("name", ["lkat", "rbfkat", "vit5", "vit"])
def test_hooked_patterns_compute_the_same_model(name, request, images):
    model = request.getfixturevalue(name)
    plain = model(images)
    logits, cache = model.run_with_cache(images, names=PATTERNS)
    assert_close(logits, plain, rtol=0, atol=1e-5)
    grads = attention_gradients(model, images)
    assert_close(grads.logits, plain, rtol=0, atol=1e-5)
    assert torch.equal(grads.attention, torch.stack(list(cache.values())))
    assert torch.equal(attention_matrices(model, images).matrices, grads.attention)
    assert not any(point.active for point in model.hook_points().values())


def test_gla_attention_gradients_satisfy_euler_identities(lkat, images):
    model, images = copy.deepcopy(lkat).double(), images.double()  # fp64 so that small row sums are checked tightly
    grads = attention_gradients(model, images, target=3)
    assert grads.target.tolist() == [3, 3]
    logits, cache = model.run_with_cache(images, names=lambda n: n.endswith(("hook_q", "hook_v")), grad=True)
    assert_close(grads.logits, logits.detach(), rtol=0, atol=1e-12)
    names = [f"blocks.{i}.attn.hook_{n}" for i in range(4) for n in ("q", "v")]
    dq_dv = torch.autograd.grad(logits[:, 3].sum(), [cache[n] for n in names])
    relevance = grads.gradients * grads.attention  # [L, B, H, T, T]
    for i in range(4):
        q, v = cache["hook_q", i].detach(), cache["hook_v", i].detach()
        dq, dv = dq_dv[2 * i], dq_dv[2 * i + 1]
        # A is linear in q_t (row t) and o = A v is linear in v_s (column s): Euler's theorem on each
        assert_close(relevance[i].sum(-1), heads_first((dq * q).sum(-1)), rtol=1e-9, atol=1e-12)
        assert_close(relevance[i].sum(-2), heads_first((dv * v).sum(-1)), rtol=1e-9, atol=1e-12)


def test_softmax_attention_gradients_satisfy_the_value_identity(rbfkat, images):
    grads = attention_gradients(rbfkat, images)
    logits, cache = rbfkat.run_with_cache(images, names=lambda n: n.endswith("hook_v"), grad=True)
    assert torch.equal(grads.target, logits.argmax(-1))
    dv = torch.autograd.grad(logits.gather(1, grads.target[:, None]).sum(), list(cache.values()))
    relevance = grads.gradients * grads.attention
    for i in range(2):
        # o = P v is linear in v_s (column s of P), so sum_t dP[t, s] P[t, s] = sum_d dv_s[d] v_s[d]
        want = heads_first((dv[i] * cache["hook_v", i].detach()).sum(-1))
        assert_close(relevance[i].sum(-2), want, rtol=1e-4, atol=1e-7)
    json.dumps(grads.to_dict(), allow_nan=False)


@pytest.mark.parametrize("name", ["lkat", "vit5", "vit"])
def test_gradient_rollout_rows_are_distributions(name, request, images):
    model = request.getfixturevalue(name)
    result = attention_rollout(model, images, method="gradient", target=torch.tensor([1, 2]))
    assert result.target.tolist() == [1, 2]
    assert_close(result.joint.sum(-1), torch.ones(result.joint.shape[:-1]))
    assert torch.all(result.joint >= 0)
    assert result.cls_map.shape == (B, 4, 4)
    with pytest.raises(ValueError, match="unknown rollout method"):
        attention_rollout(model, images, method="raw")
