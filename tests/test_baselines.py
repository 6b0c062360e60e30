"""Baselines: ViT-5 (architecture, reference names, RoPE, hooks) and hook points on timm ViT and MLP-Mixer."""

import copy
import subprocess
import sys

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.mlp_mixer import MlpMixer
from timm.models.vision_transformer import VisionTransformer
from tolerance import assert_close
from torch import nn

from lkat_lens.models.baselines import HookedTimm, attach_hook_points
from lkat_lens.models.hooks import HookedModel
from lkat_lens.models.vit5 import VIT5_VARIANTS, AxialRope2D, ViT5

B, IMG, PATCH, D, H, DEPTH, R = 2, 16, 4, 64, 2, 2, 4
N = (IMG // PATCH) ** 2
T = 1 + N + R
DH = D // H

# Paper table "results-cls" (millions of parameters at 224^2; the T/S/B rows match a 100-class head).
PAPER_VIT5_M = {
    "vit5_tiny_patch16_224": 5.54,
    "vit5_small_patch16_224": 21.69,
    "vit5_base_patch16_224": 85.85,
    "vit5_large_patch16_224": 304.00,
}
PAPER_TIMM_M = {
    "vit_tiny_patch16_224": 5.54,
    "vit_small_patch16_224": 21.70,
    "vit_base_patch16_224": 85.88,
    "vit_large_patch16_224": 304.33,
    "mixer_b16_224": 59.19,
    "mixer_l16_224": 208.20,
}

# Every state_dict key of a one-block reference ViT-5 (mehizelali/linear-kan-transformer models/vit5.py).
REFERENCE_VIT5_KEYS = {
    "cls_token", "reg_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias",
    "blocks.0.norm1.weight", "blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight",
    "blocks.0.attn.proj.bias", "blocks.0.attn.q_norm.weight", "blocks.0.attn.k_norm.weight",
    "blocks.0.attn.rope.freqs", "blocks.0.attn.rope_reg.freqs", "blocks.0.norm2.weight",
    "blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc1.bias",
    "blocks.0.mlp.fc2.weight", "blocks.0.mlp.fc2.bias", "blocks.0.gamma_1", "blocks.0.gamma_2",
    "norm.weight", "head.weight", "head.bias",
}  # fmt: skip


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def perturbed(model: nn.Module) -> nn.Module:
    """Randomise LayerScales and norm weights so every branch matters at this scale."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "gamma" in name or "norm" in name:
                p.normal_(1.0, 0.3)
    return model


@pytest.fixture(scope="module")
def vit5():
    torch.manual_seed(0)
    return perturbed(ViT5(img_size=IMG, patch_size=PATCH, embed_dim=D, depth=DEPTH, num_heads=H, num_classes=10)).eval()


@pytest.fixture(scope="module")
def images():
    return torch.randn(B, 3, IMG, IMG, generator=torch.Generator().manual_seed(1))


# ---------------------------------------------------------------- ViT-5


@pytest.mark.parametrize("name, paper", PAPER_VIT5_M.items())
def test_vit5_parameter_counts_match_paper(name, paper):
    with torch.device("meta"):
        model = ViT5(**{**VIT5_VARIANTS[name], "num_classes": 100})
    millions = n_params(model) / 1e6
    assert abs(millions - paper) / paper < 0.01, f"{name}: {millions:.3f} M vs paper {paper} M"


def test_vit5_tiny_count_is_exact():
    with torch.device("meta"):
        model = ViT5(**VIT5_VARIANTS["vit5_tiny_patch16_224"], num_classes=100)
    # 12 blocks x (12 D^2 + 10 D + 2 dh) + embedding (769 D + 202 D: cls, 4 registers, 196 pos, norm) + head.
    assert n_params(model) == 12 * (12 * 192**2 + 10 * 192 + 2 * 64) + 769 * 192 + 202 * 192 + 192 * 100 + 100


@pytest.mark.parametrize("name", VIT5_VARIANTS)
def test_vit5_variants_are_in_the_timm_registry(name):
    with torch.device("meta"):
        model = timm.create_model(name, num_classes=100)
    assert isinstance(model, ViT5)
    assert model.embed_dim == VIT5_VARIANTS[name]["embed_dim"] and len(model.blocks) == VIT5_VARIANTS[name]["depth"]


def test_lkat_lens_import_registers_vit5_and_builds_it():
    code = (
        "import lkat_lens, timm\n"
        "model = lkat_lens.create_model('vit5_micro', num_classes=3)\n"
        "print(type(model).__name__, timm.is_model('vit5_large_patch16_224'), model.num_patches)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ViT5", "True", "16"]
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model("vit5_micro", pretrained=True)


def test_vit5_state_dict_uses_reference_names():
    model = ViT5(img_size=IMG, patch_size=PATCH, embed_dim=D, depth=1, num_heads=H, num_classes=10)
    assert set(model.state_dict()) == REFERENCE_VIT5_KEYS
    attn = model.blocks[0].attn
    assert attn.qkv.bias is None and attn.proj.bias is not None
    assert attn.rope.freqs.shape == (DH // 4,) and attn.rope_reg.side == 2
    assert torch.equal(model.blocks[0].gamma_1, torch.full((D,), 1e-4))
    no_regs = ViT5(img_size=IMG, patch_size=PATCH, embed_dim=D, depth=1, num_heads=H, num_registers=0)
    assert no_regs.reg_token is None and no_regs.blocks[0].attn.rope_reg is None
    assert no_regs.no_weight_decay() == {"pos_embed", "cls_token"}
    assert "registers" not in no_regs.token_layout


def test_vit5_rejects_non_square_grids_and_other_pools():
    with pytest.raises(ValueError, match="square number of registers"):
        ViT5(img_size=IMG, patch_size=PATCH, embed_dim=D, depth=1, num_heads=H, num_registers=3)
    with pytest.raises(ValueError, match="square number of patches"):
        ViT5(img_size=(16, 32), patch_size=PATCH, embed_dim=D, depth=1, num_heads=H)
    with pytest.raises(ValueError, match="class token"):
        ViT5(img_size=IMG, patch_size=PATCH, embed_dim=D, depth=1, num_heads=H, global_pool="avg")


def test_axial_rope_rotates_pairs_by_row_then_column():
    side, dh, theta = 3, 16, 100.0
    rope = AxialRope2D(dh, side, theta)
    j = torch.arange(dh // 4, dtype=torch.float64)
    assert_close(rope.freqs.double(), theta ** (-4 * j / dh), rtol=1e-6, atol=0)
    x = torch.randn(2, side * side, 3, dh, dtype=torch.float64)
    z = torch.complex(x[..., 0::2], x[..., 1::2])  # channel pairs as complex numbers [.., dh/2]
    row = torch.arange(side * side, dtype=torch.float64) // side
    col = torch.arange(side * side, dtype=torch.float64) % side
    angle = torch.cat([row[:, None] * theta ** (-4 * j / dh), col[:, None] * theta ** (-4 * j / dh)], dim=-1)
    want = torch.view_as_real(z * torch.polar(torch.ones_like(angle), angle)[:, None]).flatten(-2)
    got = rope(x.float()).double()
    assert_close(got, want, rtol=0, atol=2e-6)


def test_vit5_hook_names_and_shapes(vit5, images):
    logits, cache = vit5.run_with_cache(images)
    want = {"hook_embed": (B, T, D), "hook_final": (B, T, D)}
    for i in range(DEPTH):
        p = f"blocks.{i}."
        want |= {p + n: (B, T, D) for n in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "attn.hook_out")}
        want |= {p + f"attn.hook_{n}": (B, T, H, DH) for n in ("q", "k", "v", "z")}  # z: per-head outputs
        want[p + "attn.hook_pattern"] = (B, H, T, T)
    assert set(vit5.list_hooks()) == set(want)
    assert {k: tuple(v.shape) for k, v in cache.items()} == want
    assert_close(logits, vit5(images), rtol=0, atol=1e-5)  # hook_pattern: explicit P @ v
    assert_close(cache["hook_final"][:, 0] @ vit5.head.weight.T + vit5.head.bias, logits)


def test_vit5_noop_hooks_keep_logits(vit5, images):
    plain = vit5(images)
    with vit5.hooks(fwd_hooks=[(lambda n: not n.endswith("hook_pattern"), lambda t, hook: None)]):
        assert torch.equal(vit5(images), plain)
    with vit5.hooks(fwd_hooks=[(lambda n: True, lambda t, hook: None)]):
        assert_close(vit5(images), plain, rtol=0, atol=1e-5)


def test_vit5_pattern_gradients_satisfy_the_value_identity(vit5, images):
    logits, cache = vit5.run_with_cache(images, names=lambda n: n.endswith(("hook_pattern", "hook_v")), grad=True)
    grads = dict(zip(cache, torch.autograd.grad(logits[:, 3].sum(), list(cache.values())), strict=True))
    for i in range(DEPTH):
        p, dp = cache["hook_pattern", i].detach(), grads[f"blocks.{i}.attn.hook_pattern"]
        v, dv = cache["hook_v", i].detach(), grads[f"blocks.{i}.attn.hook_v"]
        # o = P v is linear in v_s, so sum_t dP[t, s] P[t, s] = sum_d dv_s[d] v_s[d] (P is used in the forward)
        want = (dv * v).sum(-1).transpose(1, 2)
        assert want.abs().max() > 1e-3
        assert_close((dp * p).sum(-2), want, rtol=1e-4, atol=1e-7)


def test_vit5_token_layout_cls_first_registers_last(vit5, images):
    assert vit5.token_layout == {"cls": slice(0, 1), "patches": slice(1, 1 + N), "registers": slice(1 + N, T)}
    _, cache = vit5.run_with_cache(images, names="hook_embed")
    embed = cache["hook_embed"]
    assert torch.equal(embed[:, 0], vit5.cls_token[0, 0].detach().expand(B, D))
    assert torch.equal(embed[:, 1 + N :], vit5.reg_token.detach().expand(B, R, D))
    assert_close(embed[:, 1 : 1 + N], vit5.patch_embed(images) + vit5.pos_embed, rtol=0, atol=0)


def test_vit5_pattern_and_block_reproduce_the_forward(vit5, images):
    _, cache = vit5.run_with_cache(images, names="blocks.1.")
    pattern, q, k, v = (cache[f"blocks.1.attn.hook_{n}"] for n in ("pattern", "q", "k", "v"))
    assert_close(pattern.sum(-1), torch.ones(B, H, T), rtol=0, atol=1e-6)
    scores = torch.einsum("bthd,bshd->bhts", q, k) * DH**-0.5
    assert_close(pattern, scores.softmax(-1))
    attn, block = vit5.blocks[1].attn, vit5.blocks[1]
    mixed = torch.einsum("bhts,bshd->bthd", pattern, v).flatten(-2)
    assert_close(attn.proj(mixed), cache["blocks.1.attn.hook_out"], rtol=1e-5, atol=1e-6)
    pre, mid = cache["blocks.1.hook_resid_pre"], cache["blocks.1.hook_resid_mid"]
    assert_close(mid, pre + block.gamma_1 * cache["blocks.1.attn.hook_out"])
    assert_close(cache["blocks.1.hook_resid_post"], mid + block.gamma_2 * block.mlp(block.norm2(mid)))
    # q/k: RMS-normalised heads, then RoPE (a rotation: keeps each head's norm) on patches and registers only.
    pre_rope = attn.q_norm(attn.qkv(block.norm1(pre)).unflatten(-1, (3, H, DH))[:, :, 0])
    assert_close(q[:, 0], pre_rope[:, 0], rtol=0, atol=0)
    assert_close(q.norm(dim=-1), pre_rope.norm(dim=-1))
    assert not torch.allclose(q[:, 1:], pre_rope[:, 1:])


def test_vit5_pattern_patching_replaces_or_edits_attention(vit5, images):
    _, cache = vit5.run_with_cache(images, names="blocks.0.attn.")
    v, proj = cache["blocks.0.attn.hook_v"], vit5.blocks[0].attn.proj
    uniform = proj(v.mean(1, keepdim=True).flatten(-2)).expand(B, T, D)
    to_first = proj(v[:, :1].flatten(-2)).expand(B, T, D)

    def edit_in_place(pattern, hook):
        pattern.zero_()
        pattern[..., 0] = 1.0

    for fn, want in ((lambda p, hook: torch.full_like(p, 1.0 / T), uniform), (edit_in_place, to_first)):
        with vit5.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", fn)]):
            _, patched = vit5.run_with_cache(images, names="blocks.0.attn.hook_out")
            with torch.inference_mode():
                _, inference = vit5.run_with_cache(images, names="blocks.0.attn.hook_out")
        assert_close(patched["blocks.0.attn.hook_out"], want)
        assert_close(inference["blocks.0.attn.hook_out"], want)
    with torch.inference_mode():
        logits, cache = vit5.run_with_cache(images)
    assert_close(logits, vit5(images), rtol=0, atol=1e-5)
    assert len(cache) == len(vit5.list_hooks())


def test_vit5_forward_backward_finite_and_every_parameter_learns(images):
    torch.manual_seed(0)
    model = ViT5(img_size=IMG, patch_size=PATCH, embed_dim=D, depth=DEPTH, num_heads=H, num_classes=10,
                 drop_rate=0.1, attn_drop_rate=0.1, drop_path_rate=0.1).train()  # fmt: skip
    logits = model(images)
    assert logits.shape == (B, 10) and torch.isfinite(logits).all()
    F.cross_entropy(logits, torch.tensor([1, 7])).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_vit5_timm_api(vit5, images):
    model = copy.deepcopy(vit5)
    params = dict(model.named_parameters())
    assert model.no_weight_decay() <= set(params)
    assert model.forward_head(model.forward_features(images), pre_logits=True).shape == (B, D)
    model.reset_classifier(3)
    assert model.get_classifier().out_features == 3 and model(images).shape == (B, 3)
    model.reset_classifier(0)
    assert model(images).shape == (B, D)


# ---------------------------------------------------------------- timm ViT / MLP-Mixer


def small_vit(**kwargs) -> VisionTransformer:
    torch.manual_seed(0)
    kwargs = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5) | kwargs
    return timm.create_model("vit_tiny_patch16_224", **kwargs).eval()


def small_mixer() -> MlpMixer:
    torch.manual_seed(0)
    return MlpMixer(num_classes=5, img_size=32, patch_size=8, num_blocks=2, embed_dim=32).eval()


@pytest.fixture(scope="module")
def timm_images():
    return torch.randn(B, 3, 32, 32, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("name, paper", PAPER_TIMM_M.items())
def test_timm_baseline_parameter_counts_match_paper(name, paper):
    with torch.device("meta"):
        model = timm.create_model(name, num_classes=100)
    millions = n_params(model) / 1e6
    assert abs(millions - paper) / paper < 0.01, f"{name}: {millions:.3f} M vs paper {paper} M"


@pytest.mark.parametrize("build", [lambda: small_vit(reg_tokens=2), small_mixer], ids=["vit", "mixer"])
def test_attach_keeps_weights_outputs_and_timm_type(build, timm_images):
    model = build()
    plain, keys, cls = model(timm_images), list(model.state_dict()), type(model)
    hooked = attach_hook_points(model)
    assert hooked is model and attach_hook_points(model) is model
    assert isinstance(model, cls) and isinstance(model, HookedModel) and isinstance(model, HookedTimm)
    assert list(model.state_dict()) == keys
    assert torch.equal(model(timm_images), plain)
    with model.hooks(fwd_hooks=[(lambda n: not n.endswith("hook_pattern"), lambda t, hook: None)]):
        assert torch.equal(model(timm_images), plain)
    logits, cache = model.run_with_cache(timm_images)  # hook_pattern (ViT): explicit P @ v
    assert_close(logits, plain, rtol=0, atol=1e-5)
    assert_close(model.forward_head(cache["hook_final"]), logits, rtol=0, atol=0)


def test_hooked_vit_names_shapes_and_layout(timm_images):
    model = attach_hook_points(small_vit(reg_tokens=2))
    t = 1 + 2 + 16
    _, cache = model.run_with_cache(timm_images)
    want = {"hook_embed": (B, t, 32), "hook_final": (B, t, 32)}
    for i in range(2):
        want |= {f"blocks.{i}.hook_resid_pre": (B, t, 32), f"blocks.{i}.hook_resid_post": (B, t, 32)}
        want |= {f"blocks.{i}.attn.hook_out": (B, t, 32), f"blocks.{i}.attn.hook_pattern": (B, 2, t, t)}
    assert set(model.list_hooks()) == set(want)
    assert {k: tuple(v.shape) for k, v in cache.items()} == want
    assert model.token_layout == {"cls": slice(0, 1), "registers": slice(1, 3), "patches": slice(3, t)}
    embed = cache["hook_embed"]
    prefix = torch.cat([model.cls_token, model.reg_token], dim=1) + model.pos_embed[:, :3]
    assert torch.equal(embed[:, :3], prefix.detach().expand(B, 3, 32))
    assert torch.equal(cache["blocks.0.hook_resid_pre"], embed)
    assert torch.equal(cache["blocks.1.hook_resid_pre"], cache["blocks.0.hook_resid_post"])
    plain = attach_hook_points(small_vit(class_token=False, global_pool="avg"))
    assert plain.token_layout == {"patches": slice(0, 16)}


def test_hooked_vit_pattern_reproduces_attention_output(timm_images):
    model = attach_hook_points(small_vit())
    t = 17
    _, cache = model.run_with_cache(timm_images, names="blocks.1.")
    pattern, out, pre = (
        cache["blocks.1.attn.hook_pattern"],
        cache["blocks.1.attn.hook_out"],
        cache["blocks.1.hook_resid_pre"],
    )
    assert_close(pattern.sum(-1), torch.ones(B, 2, t), rtol=0, atol=1e-6)
    block = model.blocks[1]
    q, k, v = block.attn.qkv(block.norm1(pre)).unflatten(-1, (3, 2, 16)).unbind(2)
    assert_close(pattern, torch.einsum("bthd,bshd->bhts", q, k).mul(16**-0.5).softmax(-1))
    mixed = torch.einsum("bhts,bshd->bthd", pattern, v).flatten(-2)
    assert_close(block.attn.proj(mixed), out, rtol=1e-5, atol=1e-6)
    mid = pre + out
    assert_close(cache["blocks.1.hook_resid_post"], mid + block.mlp(block.norm2(mid)))


def test_hooked_vit_patching_changes_the_forward(timm_images):
    model = attach_hook_points(small_vit())
    _, cache = model.run_with_cache(timm_images, names=["blocks.0.hook_resid_pre"])
    block = model.blocks[0]
    v = block.attn.qkv(block.norm1(cache["blocks.0.hook_resid_pre"])).unflatten(-1, (3, 2, 16))[:, :, 2]
    uniform = lambda p, hook: torch.full_like(p, 1.0 / 17)  # noqa: E731
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", uniform)]):
        _, patched = model.run_with_cache(timm_images, names=["blocks.0.attn.hook_out"])
    want = block.attn.proj(v.mean(1, keepdim=True).flatten(-2)).expand(B, 17, 32)
    assert_close(patched["blocks.0.attn.hook_out"], want)
    zero = lambda x, hook: torch.zeros_like(x)  # noqa: E731
    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_post", zero)]):
        _, patched = model.run_with_cache(timm_images, names=["blocks.1.hook_resid_pre"])
    assert torch.equal(patched["blocks.1.hook_resid_pre"], torch.zeros(B, 17, 32))
    with model.hooks(fwd_hooks=[("blocks.1.hook_resid_pre", zero)]):
        _, patched = model.run_with_cache(timm_images, names=["blocks.1.attn.hook_out"])
    second = model.blocks[1]
    assert_close(patched["blocks.1.attn.hook_out"], second.attn(second.norm1(torch.zeros(B, 17, 32))))


def test_hooked_mixer_names_and_layout(timm_images):
    model = attach_hook_points(small_mixer())
    _, cache = model.run_with_cache(timm_images)
    want = {"hook_embed", "hook_final"} | {f"blocks.{i}.hook_resid_{s}" for i in range(2) for s in ("pre", "post")}
    assert set(model.list_hooks()) == want and set(cache) == want
    assert all(v.shape == (B, 16, 32) for v in cache.values())
    assert model.token_layout == {"patches": slice(0, 16)}
    assert torch.equal(cache["hook_embed"], model.stem(timm_images))


def test_deepcopy_routes_hooks_to_the_copy(timm_images):
    model = attach_hook_points(small_vit())
    twin = copy.deepcopy(model)
    _, cache = twin.run_with_cache(timm_images)
    assert len(cache) == len(twin.list_hooks())
    assert all(not point._forward_hooks for point in model.hook_points().values())


def test_attach_rejects_other_models():
    with pytest.raises(TypeError, match="VisionTransformer and MlpMixer"):
        attach_hook_points(nn.Linear(2, 2))
