"""Reference trainer checkpoints (`model`, `optimizer`, ..., `cfg`) open exactly, or are refused by name.

Each test writes a file in the reference trainer's layout whose state_dict has the reference code's keys and
shapes for the options in `cfg`, loads it with `lkat_lens.load` (no variant given), and compares the logits and
gradients with an independent plain-torch computation of the reference's forward from the same state_dict.
"""

import math
import pathlib

import pytest
import torch
import torch.nn.functional as F

import lkat_lens
from lkat_lens.checkpoint import CheckpointError
from lkat_lens.models.rope import Rope2DV0
from tests.tolerance import assert_close

IMG, PATCH, DIM, DEPTH, HEADS = 16, 4, 64, 4, 2  # lkat_micro's sizes: 4x4 patches, head dim 32
BASE_CFG = {"embed_dim": DIM, "depth": DEPTH, "num_heads": HEADS, "input_size": IMG, "patch_size": PATCH}
BASE_CFG |= {"dataset": "cifar10", "lr": 3e-4, "epochs": 50, "batch_size": 256, "kan_compile": True}


# ---- the reference model's keys and shapes, and its forward, written from its source ---------------------------
def options(cfg):
    """The reference constructor's values for the options this file varies (its defaults elsewhere)."""
    katt = cfg["model"].startswith("KATT")
    return {
        "katt": katt,
        "cls": bool(cfg.get("use_cls_token", True)),
        "abs_pos": bool(cfg.get("use_abs_pos", True)),
        "regs": int(cfg.get("num_registers", 4)),
        "rope": cfg.get("rope_mode", "2dv1"),
        "theta": float(cfg.get("rope_theta", 10000.0)),
        "short_conv": bool(cfg.get("use_short_conv", True)) and not katt,
        "conv": int(cfg.get("conv_size", 4)),
        "key": int(DIM * (1.0 if katt else cfg.get("expand_k", 1.0))),
        "value": int(DIM * (1.0 if katt else cfg.get("expand_v", 1.0))),
        "grids": int(cfg.get("grid", cfg.get("kan_num_grids", 4))),
        "gmin": float(cfg.get("kan_grid_min", -1.0 if katt else -2.0)),
        "gmax": float(cfg.get("kan_grid_max", 1.0 if katt else 2.0)),
        "kan_ln": bool(cfg.get("use_layernorm", katt)),
        "base": bool(cfg.get("use_base_update", False)),
        "drop": float(cfg.get("dropout", 0.0)),
        "attn_drop": float(cfg.get("attn_drop_rate", 0.0)),
    }


def v0_tables(hw, head_dim, theta):
    """The reference's 2dv0 cos/sin buffers, step by step as its RotaryEmbeddingFast builds them."""
    half = head_dim // 2
    frequency = 1.0 / (theta ** (torch.arange(0, half, 2).float() / half))
    pos = (torch.arange(hw) / hw * half)[:, None] @ frequency[None, :]
    pos = torch.cat([pos, pos], dim=1)
    height = pos[:, None, :].expand(hw, hw, half)
    width = pos[None, :, :].expand(hw, hw, half)
    position = torch.cat((height, width), dim=-1).reshape(hw * hw, head_dim)
    return position.cos(), position.sin()


def reference_state_dict(o, classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    n, hw, hidden = (IMG // PATCH) ** 2, IMG // PATCH, 4 * DIM
    dk, dv = o["key"] // HEADS, o["value"] // HEADS
    shapes = {
        "register_tokens": (1, o["regs"], DIM),
        "patch_embed.proj.weight": (DIM, 3, PATCH, PATCH),
        "patch_embed.proj.bias": (DIM,),
        "head.weight": (classes, DIM),
        "head.bias": (classes,),
    }
    if o["cls"]:
        shapes["cls_token"] = (1, 1, DIM)
    if o["abs_pos"]:
        shapes["pos_embed"] = (1, n + o["regs"] + int(o["cls"]), DIM)
    norms = ["norm"] + [f"blocks.{i}.{k}" for i in range(DEPTH) for k in ("norm1", "norm2")]
    for name in norms:
        shapes[name + ".weight"] = (DIM,)
        if not o["katt"]:
            shapes[name + ".bias"] = (DIM,)
    for i in range(DEPTH):
        a = f"blocks.{i}.attn."
        if o["katt"]:
            shapes |= {a + "qkv.weight": (3 * DIM, DIM), a + "qkv.bias": (3 * DIM,), a + "proj.weight": (DIM, DIM)}
            shapes |= {
                a + "proj.bias": (DIM,),
                a + "q_norm.weight": (DIM // HEADS,),
                a + "k_norm.weight": (DIM // HEADS,),
            }
        else:
            shapes |= {a + "q_proj.weight": (o["key"], DIM), a + "k_proj.weight": (o["key"], DIM)}
            shapes |= {a + "v_proj.weight": (o["value"], DIM), a + "g_proj.weight": (o["value"], DIM)}
            shapes |= {a + "o_proj.weight": (DIM, o["value"]), a + "gk_proj.0.weight": (16, DIM)}
            shapes |= {a + "gk_proj.1.weight": (o["key"], 16), a + "gk_proj.1.bias": (o["key"],)}
            shapes |= {a + "q_norm.weight": (dk,), a + "k_norm.weight": (dk,)}
            shapes |= {a + "g_norm.weight": (dv,), a + "g_norm.bias": (dv,)}
            if o["short_conv"]:
                for conv, width in (("q", o["key"]), ("k", o["key"]), ("v", o["value"])):
                    shapes[a + f"{conv}_conv1d.weight"] = (width, 1, o["conv"])
        for fc, (fan_in, fan_out) in (("fc1", (DIM, hidden)), ("fc2", (hidden, DIM))):
            m = f"blocks.{i}.mlp.{fc}."
            shapes |= {m + "grid_linear.weight": (1, o["grids"]), m + "dim_linear.weight": (fan_out, fan_in)}
            if o["kan_ln"]:
                shapes |= {m + "layernorm.weight": (fan_in,), m + "layernorm.bias": (fan_in,)}
            if o["base"]:
                shapes |= {m + "base_linear.weight": (fan_out, fan_in), m + "base_linear.bias": (fan_out,)}
    sd = {}
    for k, s in shapes.items():
        fan_in = math.prod(s[1:]) if len(s) > 1 else 1
        w = torch.randn(s, generator=g) * (0.1 if len(s) == 1 else fan_in**-0.5)
        sd[k] = 1.0 + w if k.endswith(("norm.weight", "norm1.weight", "norm2.weight", "layernorm.weight")) else w
    for i in range(DEPTH):
        for fc in ("fc1", "fc2"):
            sd[f"blocks.{i}.mlp.{fc}.rbf.grid"] = torch.linspace(o["gmin"], o["gmax"], o["grids"])
        if o["rope"] == "2dv0":
            cos, sin = v0_tables(hw, o["key"] // HEADS, o["theta"])
            sd[f"blocks.{i}.attn.rotary.freqs_cos"], sd[f"blocks.{i}.attn.rotary.freqs_sin"] = cos, sin
    return sd


def rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, o, sd, i, n):
    """q or k [B, T, H, d]: the reference's RoPE on the first n tokens."""
    hw, d = IMG // PATCH, x.shape[-1]
    p = x[:, :n]
    if o["rope"] == "2dv1":
        freqs = 1.0 / (o["theta"] ** (torch.arange(0, d, 4)[: d // 4].float() / d))
        flat = torch.arange(n)
        xs = torch.outer((14 / hw) * (flat % hw), freqs)
        ys = torch.outer((14 / hw) * (flat // hw), freqs)
        cis = torch.cat(
            [torch.polar(torch.ones_like(xs), xs)[..., None], torch.polar(torch.ones_like(ys), ys)[..., None]], -1
        )
        cis = cis.reshape(n, -1)[None, :, None, :]
        p = torch.view_as_real(torch.view_as_complex(p.contiguous().reshape(*p.shape[:-1], -1, 2)) * cis).flatten(3)
    else:
        cos = sd[f"blocks.{i}.attn.rotary.freqs_cos"][None, :, None]
        sin = sd[f"blocks.{i}.attn.rotary.freqs_sin"][None, :, None]
        x1, x2 = p.reshape(*p.shape[:-1], -1, 2).unbind(-1)
        p = p * cos + torch.stack((-x2, x1), -1).reshape_as(p) * sin
    return torch.cat([p, x[:, n:]], dim=1)


def dropout(x, p, train):
    return F.dropout(x, p, training=train) if p > 0 else x


def kan_layer(x, sd, m, o):
    xn = F.layer_norm(x, x.shape[-1:], sd[m + "layernorm.weight"], sd[m + "layernorm.bias"]) if o["kan_ln"] else x
    grid = sd[m + "rbf.grid"]
    h = (o["gmax"] - o["gmin"]) / (o["grids"] - 1)
    reduced = (torch.exp(-(((xn[..., None] - grid) / h) ** 2)) * sd[m + "grid_linear.weight"][0]).sum(-1)
    out = reduced @ sd[m + "dim_linear.weight"].T
    if o["base"]:
        out = out + F.silu(x) @ sd[m + "base_linear.weight"].T + sd[m + "base_linear.bias"]
    return out


def gla(x, sd, a, o, i, n):
    b, t, _ = x.shape
    dk, dv = o["key"] // HEADS, o["value"] // HEADS

    def proj_conv(name):
        y = x @ sd[a + f"{name}_proj.weight"].T
        if o["short_conv"]:
            w = sd[a + f"{name}_conv1d.weight"]
            y = F.silu(
                F.conv1d(y.transpose(1, 2), w, padding=o["conv"] - 1, groups=y.shape[-1])[..., :t].transpose(1, 2)
            )
        return y

    q, k = proj_conv("q").unflatten(-1, (HEADS, dk)), proj_conv("k").unflatten(-1, (HEADS, dk))
    v = proj_conv("v").unflatten(-1, (HEADS, dv))
    gk = (x @ sd[a + "gk_proj.0.weight"].T) @ sd[a + "gk_proj.1.weight"].T + sd[a + "gk_proj.1.bias"]
    gk = F.logsigmoid(gk).unflatten(-1, (HEADS, dk)) / 16
    q, k = rope(rms(q, sd[a + "q_norm.weight"]), o, sd, i, n), rope(rms(k, sd[a + "k_norm.weight"]), o, sd, i, n)
    state, outs = torch.zeros(b, HEADS, dk, dv), []
    for s in range(t):  # S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T;  o_t = scale * S_t^T q_t
        state = gk[:, s, :, :, None].exp() * state + k[:, s, :, :, None] * v[:, s, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, s] * dk**-0.5, state))
    out = F.layer_norm(torch.stack(outs, 1), (dv,), sd[a + "g_norm.weight"], sd[a + "g_norm.bias"]).flatten(-2)
    return (out * F.silu(x @ sd[a + "g_proj.weight"].T)) @ sd[a + "o_proj.weight"].T


def mhsa(x, sd, a, o, i, n, train):
    b, t, _ = x.shape
    qkv = (x @ sd[a + "qkv.weight"].T + sd[a + "qkv.bias"]).reshape(b, t, 3, HEADS, DIM // HEADS)
    q, k, v = qkv.unbind(2)
    q, k = rope(rms(q, sd[a + "q_norm.weight"]), o, sd, i, n), rope(rms(k, sd[a + "k_norm.weight"]), o, sd, i, n)
    q, k, v = (z.transpose(1, 2) for z in (q, k, v))
    y = F.scaled_dot_product_attention(
        q, k, v, dropout_p=o["attn_drop"] if train else 0.0, scale=(DIM // HEADS) ** -0.5
    )
    return y.transpose(1, 2).reshape(b, t, DIM) @ sd[a + "proj.weight"].T + sd[a + "proj.bias"]


def reference_forward(sd, o, images, train=False):
    """The reference LKAT / KATT forward (fp32), from its source, on a state_dict."""
    n = (IMG // PATCH) ** 2
    x = (
        F.conv2d(images, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=PATCH)
        .flatten(2)
        .transpose(1, 2)
    )
    x = torch.cat(
        [x, sd["register_tokens"].expand(len(x), -1, -1)]
        + ([sd["cls_token"].expand(len(x), -1, -1)] if o["cls"] else []),
        1,
    )
    x = dropout(x + sd["pos_embed"] if o["abs_pos"] else x, o["drop"], train)

    def norm(z, name):
        if o["katt"]:
            return rms(z, sd[name + ".weight"])
        return F.layer_norm(z, (DIM,), sd[name + ".weight"], sd[name + ".bias"])

    for i in range(DEPTH):
        blk, a = f"blocks.{i}.", f"blocks.{i}.attn."
        if o["katt"]:
            y = dropout(mhsa(norm(x, blk + "norm1"), sd, a, o, i, n, train), o["drop"], train)
        else:
            y = dropout(dropout(gla(norm(x, blk + "norm1"), sd, a, o, i, n), o["attn_drop"], train), o["drop"], train)
        x = x + y
        h = dropout(kan_layer(norm(x, blk + "norm2"), sd, blk + "mlp.fc1.", o), o["drop"], train)
        x = x + dropout(kan_layer(h, sd, blk + "mlp.fc2.", o), o["drop"], train)
    x = norm(x, "norm")
    pooled = x[:, -1] if o["cls"] else x[:, :n].mean(1)
    return pooled @ sd["head.weight"].T + sd["head.bias"]


def write_reference_checkpoint(path, sd, cfg):
    """The reference trainer's checkpoint layout (Trainer._save), plain containers only."""
    optimizer = {"state": {}, "param_groups": [{"lr": 3e-4, "weight_decay": 0.05, "params": list(range(len(sd)))}]}
    state = {"model": sd, "optimizer": optimizer, "epoch": 49, "best_epoch": 47, "scaler": None}
    state |= {"max_accuracy": 91.25, "seed": 1234, "cfg": dict(cfg)}
    torch.save(state, path)
    torch.load(path, weights_only=True)  # readable without unpickling objects, like the reference's own files
    return path


# ---- options implemented exactly ------------------------------------------------------------------------------
LKAT_CASES = {
    "default": {},
    "rope_2dv0": {"rope_mode": "2dv0"},
    "rope_2dv0_theta": {"rope_mode": "2dv0", "rope_theta": 100.0},
    "rope_theta": {"rope_theta": 100.0},
    "no_cls_token": {"use_cls_token": False},
    "no_abs_pos": {"use_abs_pos": False},
    "registers_1": {"num_registers": 1},
    "registers_7": {"num_registers": 7},
    "no_short_conv": {"use_short_conv": False},
    "conv_size_2": {"conv_size": 2},
    "expand_k_half": {"expand_k": 0.5},
    "expand_v_2": {"expand_v": 2.0},
    "grid_alias": {"kan_num_grids": 8, "grid": 6, "kan_grid_min": -1.5, "kan_grid_max": 3.0},
    "layernorm_base_update": {"use_layernorm": True, "use_base_update": True},
    "dropout_rates": {"dropout": 0.2, "attn_drop_rate": 0.3, "drop_path_rate": 0.1},
    "everything": {
        "rope_mode": "2dv0",
        "use_cls_token": False,
        "use_abs_pos": False,
        "num_registers": 2,
        "conv_size": 3,
        "expand_k": 0.5,
        "expand_v": 2.0,
    },
}
KATT_CASES = {
    "default": {},
    "rope_2dv0": {"rope_mode": "2dv0", "rope_theta": 500.0},
    "no_cls_no_abs_pos": {"use_cls_token": False, "use_abs_pos": False, "num_registers": 3},
    "no_layernorm": {"use_layernorm": False, "kan_num_grids": 5},
    "gla_keys_are_ignored_by_katt": {"expand_k": 0.5, "use_short_conv": False, "conv_size": 2},
    "dropout_rates": {"dropout": 0.2, "attn_drop_rate": 0.3},
}
CASES = [("LKAT-T", k, v) for k, v in LKAT_CASES.items()] + [("KATT-S", k, v) for k, v in KATT_CASES.items()]


@pytest.mark.parametrize(("model", "case", "extra"), CASES, ids=[f"{m}-{c}" for m, c, _ in CASES])
def test_reference_checkpoint_gives_the_reference_logits_and_gradients(tmp_path, model, case, extra):
    cfg = {**BASE_CFG, "model": model, **extra}
    o = options(cfg)
    sd = reference_state_dict(o)
    path = write_reference_checkpoint(tmp_path / "checkpoint.pth", sd, cfg)
    ours, info = lkat_lens.load(path)  # no variant: everything from cfg
    assert info.format == "reference-trainer" and info.model_kwargs["img_size"] == IMG
    images = torch.randn(2, 3, IMG, IMG, generator=torch.Generator().manual_seed(1))

    params = {
        k: v.clone().requires_grad_(v.is_floating_point() and ".rbf.grid" not in k and "freqs_" not in k)
        for k, v in sd.items()
    }
    x_ref, x_ours = images.clone().requires_grad_(), images.clone().requires_grad_()
    expected = reference_forward(params, o, x_ref)
    logits = ours(x_ours)
    assert_close(logits, expected, rtol=1e-4, atol=1e-5)
    (expected * torch.arange(1, 11)).sum().backward()
    (logits * torch.arange(1, 11)).sum().backward()
    # gradients sum over many more fp32 products (and the two GLA forms sum in different orders): looser, still
    # scaled to the gradient's magnitude
    assert_close(x_ours.grad, x_ref.grad, rtol=1e-3, atol=1e-4)
    ours_grads = dict(ours.named_parameters())
    for name, p in params.items():
        if p.requires_grad:
            assert_close(ours_grads[name].grad, p.grad, rtol=1e-3, atol=1e-4, msg=name)

    if o["drop"] or o["attn_drop"]:  # training mode: the same dropout masks at the same places
        ours.train()
        for blk in ours.blocks:
            blk.drop_path = torch.nn.Identity()  # the reference's DropPath draws its mask differently
        torch.manual_seed(5)
        expected = reference_forward(sd, o, images, train=True)
        torch.manual_seed(5)
        assert_close(ours(images), expected, rtol=1e-4, atol=1e-5)


SHAPE_VISIBLE = [c for c in LKAT_CASES if c not in ("rope_theta", "rope_2dv0_theta", "dropout_rates")]


@pytest.mark.parametrize("case", SHAPE_VISIBLE)
def test_bare_state_dict_with_a_variant_reads_the_options_off_the_shapes(tmp_path, case):
    """Without cfg: registers, class token, positions, convs, widths, KAN grid and 2dv0 tables come from shapes."""
    cfg = {**BASE_CFG, "model": "LKAT-T", **LKAT_CASES[case]}
    o = options(cfg)
    sd = reference_state_dict(o)
    torch.save(sd, tmp_path / "bare.pth")
    model, info = lkat_lens.load(tmp_path / "bare.pth", variant="lkat_micro")
    assert info.provenance["model_name"] == "variant argument"
    images = torch.randn(2, 3, IMG, IMG, generator=torch.Generator().manual_seed(2))
    assert_close(model(images), reference_forward(sd, o, images), rtol=1e-4, atol=1e-5)


def test_provenance_names_the_source_of_every_option(tmp_path):
    cfg = {**BASE_CFG, "model": "LKAT-T", "rope_mode": "2dv0", "grid": 6}
    sd = reference_state_dict(options(cfg))
    _, info = lkat_lens.load(write_reference_checkpoint(tmp_path / "c.pth", sd, cfg))
    p = info.provenance
    assert p["model_name"] == "cfg['model']='LKAT-T'" and info.model_name == "lkat_tiny_patch16_224"
    assert p["rope_mode"] == "cfg['rope_mode']" and p["kan_num_grids"] == "cfg['grid']"
    assert p["conv_size"] == "reference LKAT-T default" and p["embed_dim"] == "cfg['embed_dim']"
    assert set(info.model_kwargs) <= set(p)
    assert info.data["name"] == "cifar10" and info.data["class_names"][0] == "airplane"
    assert info.data["mean"] == [0.4914, 0.4822, 0.4465] and info.data["crop_pct"] == 0.875
    assert p["data.mean"] == "reference dataset table for 'cifar10'"
    assert info.train["epoch"] == 49 and info.train["max_accuracy"] == 91.25 and info.train["args"]["epochs"] == 50


@pytest.mark.parametrize(
    ("dataset", "name", "classes", "first"),
    [
        ("cifar100", "cifar100", 100, "apple"),
        ("ImageNet-100", "imagenet100", 100, None),
        ("in100", "imagenet100", 100, None),
    ],
)
def test_dataset_gives_class_count_and_normalisation(tmp_path, dataset, name, classes, first):
    cfg = {**BASE_CFG, "model": "KATT-T", "dataset": dataset}
    sd = reference_state_dict(options(cfg), classes=classes)
    model, info = lkat_lens.load(write_reference_checkpoint(tmp_path / "c.pth", sd, cfg))
    assert info.data["name"] == name and model.num_classes == classes
    assert (info.data["class_names"] or [None])[0] == first
    if name == "imagenet100":
        assert info.data["mean"] == [0.485, 0.456, 0.406] and info.data["std"] == [0.229, 0.224, 0.225]


def test_rbf_gating_variant_builds_the_gated_kan(tmp_path):
    """LKAT-B-RBF-Gating: LKAT with gated-residual KAN layers; the reference forces use_base_update off."""
    sd = reference_state_dict(options({**BASE_CFG, "model": "LKAT-T"}))
    for i in range(DEPTH):
        for fc, (fan_in, fan_out) in (("fc1", (DIM, 4 * DIM)), ("fc2", (4 * DIM, DIM))):
            sd[f"blocks.{i}.mlp.{fc}.gat_resid.weight"] = torch.randn(fan_out, fan_in) * 0.1
            sd[f"blocks.{i}.mlp.{fc}.gat_resid.bias"] = torch.zeros(fan_out)
    cfg = {**BASE_CFG, "model": "LKAT-B-RBF-Gating", "use_base_update": True}
    model, info = lkat_lens.load(write_reference_checkpoint(tmp_path / "c.pth", sd, cfg))
    assert info.model_name == "lkat_base_patch16_224" and info.model_kwargs["kan_gated"] is True
    assert info.model_kwargs["kan_base_update"] is False and info.provenance["kan_base_update"].startswith("fixed by")
    assert torch.equal(model.blocks[1].mlp.fc2.gat_resid.weight, sd["blocks.1.mlp.fc2.gat_resid.weight"])


def test_2dv0_tables_match_the_reference_formula():
    rope = Rope2DV0((4, 4), 16, 100.0)
    cos, sin = v0_tables(4, 16, 100.0)
    assert torch.equal(rope.freqs_cos, cos) and torch.equal(rope.freqs_sin, sin)


def test_drop_path_rates_follow_the_reference_schedule(tmp_path):
    cfg = {**BASE_CFG, "model": "LKAT-T", "drop_path_rate": 0.1}
    model, _ = lkat_lens.load(write_reference_checkpoint(tmp_path / "c.pth", reference_state_dict(options(cfg)), cfg))
    rates = [getattr(b.drop_path, "drop_prob", 0.0) for b in model.blocks]
    assert rates == pytest.approx(torch.linspace(0, 0.1, DEPTH).tolist())


# ---- refused by name -----------------------------------------------------------------------------------------
REFUSED = [
    ({"model": "ViT5-B"}, "model='ViT5-B'"),
    ({"model": "ViG-T"}, "model='ViG-T'"),
    ({"model": "LKAT-X"}, "model='LKAT-X'"),
    ({"model": "KATT-L"}, "model='KATT-L'"),
    ({"model": "LKAT-T-RBF-Gating"}, "model='LKAT-T-RBF-Gating'"),
    ({"model": "LKAT-T", "timm_model": "vit_tiny_patch16_224"}, "timm_model='vit_tiny_patch16_224'"),
    ({"model": "LKAT-T", "rope_mode": "1d"}, "rope_mode='1d'"),
    ({"model": "KATT-T", "rope_mode": "2dv2"}, "rope_mode='2dv2'"),
    ({"model": "LKAT-T", "kan_type": "bspline"}, "kan_type='bspline'"),
    ({"model": "LKAT-T", "num_registers": 0}, "num_registers=0"),
    ({"model": "LKAT-T", "dataset": "mnist"}, "dataset='mnist'"),
    ({"model": "LKAT-T", "conv_size": "wide"}, "conv_size='wide'"),
]


@pytest.mark.parametrize(("extra", "message"), REFUSED, ids=[m for _, m in REFUSED])
def test_options_lkat_lens_cannot_rebuild_are_refused_by_name(tmp_path, extra, message):
    cfg = {**BASE_CFG, **extra}
    sd = reference_state_dict(options({**BASE_CFG, "model": "LKAT-T"}))
    with pytest.raises(CheckpointError, match="reference cfg option " + message.replace("(", r"\(")):
        lkat_lens.load(write_reference_checkpoint(tmp_path / "c.pth", sd, cfg))


def test_cfg_that_disagrees_with_the_weights_is_refused(tmp_path):
    sd = reference_state_dict(options({**BASE_CFG, "model": "LKAT-T", "use_abs_pos": False}))
    path = write_reference_checkpoint(tmp_path / "c.pth", sd, {**BASE_CFG, "model": "LKAT-T"})
    with pytest.raises(CheckpointError, match="missing keys.*pos_embed"):
        lkat_lens.load(path)
    sd = reference_state_dict(options({**BASE_CFG, "model": "LKAT-T"}), classes=100)
    with pytest.raises(CheckpointError, match="100 classes but cfg dataset='cifar10' has 10"):
        lkat_lens.load(write_reference_checkpoint(tmp_path / "d.pth", sd, {**BASE_CFG, "model": "LKAT-T"}))


def test_cfg_with_objects_weights_only_refuses_gets_one_clear_error(tmp_path):
    sd = reference_state_dict(options({**BASE_CFG, "model": "LKAT-T"}))
    path = tmp_path / "c.pth"
    torch.save(
        {"model": sd, "epoch": 1, "cfg": {**BASE_CFG, "model": "LKAT-T", "output_dir": pathlib.PurePosixPath("o")}},
        path,
    )
    with pytest.raises(CheckpointError, match="refusing to load .*PurePosixPath"):
        lkat_lens.load(path)


def test_cfg_that_is_not_a_dict_is_refused(tmp_path):
    sd = reference_state_dict(options({**BASE_CFG, "model": "LKAT-T"}))
    path = tmp_path / "c.pth"
    torch.save({"model": sd, "epoch": 1, "cfg": ["LKAT-T"]}, path)
    with pytest.raises(CheckpointError, match="'cfg' is a list, not a dict"):
        lkat_lens.load(path)


@pytest.mark.parametrize("model_name", ["LKAT-T", "KATT-S"])
def test_hooked_attention_pattern_path_keeps_the_reference_logits(tmp_path, model_name):
    """With hook_pattern hooked the pattern is materialised (o = pattern @ v); the options flow through it too."""
    extra = (
        LKAT_CASES["everything"] if model_name == "LKAT-T" else KATT_CASES["no_cls_no_abs_pos"] | {"rope_mode": "2dv0"}
    )
    cfg = {**BASE_CFG, "model": model_name, **extra}
    o = options(cfg)
    sd = reference_state_dict(o)
    model, _ = lkat_lens.load(write_reference_checkpoint(tmp_path / "c.pth", sd, cfg))
    images = torch.randn(2, 3, IMG, IMG, generator=torch.Generator().manual_seed(3))
    logits, cache = model.run_with_cache(images, names=lambda name: name.endswith("hook_pattern"))
    assert len(cache) == DEPTH
    assert_close(logits, reference_forward(sd, o, images), rtol=1e-4, atol=1e-5)
