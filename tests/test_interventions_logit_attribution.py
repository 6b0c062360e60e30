"""Direct logit attribution and the logit lens (issue 17), against the hook points' own writes and by-hand norms."""

import pytest
import torch
import torch.nn.functional as F
from tolerance import assert_close

import lkat_lens
from lkat_lens.analyses.interventions import direct_logit_attribution, logit_lens

CLS = 20


def small(name: str, **kwargs):
    torch.manual_seed(0)
    kwargs = dict(num_classes=10, img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2) | kwargs
    return lkat_lens.create_model(name, **kwargs).eval()


def test_contributions_sum_to_the_logit(lkat, images):
    dla = direct_logit_attribution(lkat, images)
    assert dla.components == ["embed", "attn 0", "mlp 0", "attn 1", "mlp 1", "attn 2", "mlp 2", "attn 3", "mlp 3"]
    assert dla.axes == ("image", "component", "position") and dla.contributions.shape == (2, 9, 21)
    assert_close(dla.logit, dla.model_logit, rtol=0, atol=1e-5)
    assert_close(dla.totals.sum(1) + dla.bias[:, CLS], dla.logit, rtol=0, atol=1e-10)
    assert torch.equal(dla.target, lkat(images).argmax(-1))


def test_components_are_each_blocks_writes_through_the_frozen_norm(lkat, images):
    dla = direct_logit_attribution(lkat, images, target=3)
    _, cache = lkat.run_with_cache(images)
    final = cache["resid_post", 3].double()
    sigma = torch.sqrt(final.var(-1, unbiased=False, keepdim=True) + lkat.norm.eps)  # the clean run's, frozen
    w, row = lkat.norm.weight.double(), lkat.head.weight[3].double()

    def direct(write: torch.Tensor) -> torch.Tensor:
        write = write.double()
        return ((write - write.mean(-1, keepdim=True)) / sigma * w) @ row

    for i in range(4):
        assert_close(dla.contributions[:, 1 + 2 * i], direct(cache["attn_out", i]), rtol=0, atol=1e-5)
        assert_close(dla.contributions[:, 2 + 2 * i], direct(cache["mlp_out", i]), rtol=0, atol=1e-5)
    assert_close(dla.contributions[:, 0], direct(cache["hook_embed"]), rtol=0, atol=1e-5)
    per_position = lkat.head(cache["hook_final"])[..., 3].double()  # DLA per patch: the head read at each position
    assert_close(dla.contributions.sum(1) + dla.bias, per_position, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "name, kwargs",
    [("rbfkat_tiny_patch16_224", {}), ("lkat_tiny_patch16_224", {"use_cls_token": False}), ("vit5_micro", {})],
    ids=["rmsnorm", "mean-pooled", "vit5-layerscale"],
)
def test_other_norms_and_readouts_sum_to_the_logit(name, kwargs, images):
    model = small(name, **kwargs)
    dla = direct_logit_attribution(model, images)
    assert_close(dla.logit, dla.model_logit, rtol=0, atol=1e-5)
    if not kwargs:
        cls = model.token_layout["cls"].start
        assert dla.readout[cls] == 1 and dla.readout.sum() == 1
    else:
        assert_close(dla.readout[:16], torch.full((16,), 1 / 16, dtype=torch.float64))
        assert dla.readout[16:].sum() == 0


def test_blocks_without_a_mid_point_attribute_whole_blocks(images):
    vit = small("vit_tiny_patch16_224")
    dla = direct_logit_attribution(vit, images)
    assert dla.components == ["embed", "block 0", "block 1"]
    assert_close(dla.logit, dla.model_logit, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="no per-head outputs"):
        direct_logit_attribution(vit, images, heads=True)


def test_logit_lens_reads_each_residual_through_the_norm(lkat, images):
    lens = logit_lens(lkat, images, target=[1, 2])
    logits, cache = lkat.run_with_cache(images)
    assert lens.layers == ["embed", "block 0", "block 1", "block 2", "block 3"]
    assert_close(lens.logits[:, -1], logits.double(), rtol=0, atol=1e-5)
    norm = lkat.norm
    for layer, x in enumerate([cache["hook_embed"]] + [cache["resid_post", i] for i in range(4)]):
        by_hand = F.layer_norm(x, (64,), norm.weight, norm.bias, norm.eps) @ lkat.head.weight.T + lkat.head.bias
        assert_close(lens.logits[:, layer], by_hand[:, CLS].double(), rtol=0, atol=1e-5)
        assert_close(lens.target_logit[0, layer], by_hand[0, :, 1].double(), rtol=0, atol=1e-5)
        assert_close(lens.target_logit[1, layer], by_hand[1, :, 2].double(), rtol=0, atol=1e-5)


def test_models_without_a_linear_head_are_refused(images):
    model = small("lkat_tiny_patch16_224", num_classes=0)
    with pytest.raises(ValueError, match="needs a final LayerNorm or RmsNorm `norm` and a Linear `head`"):
        direct_logit_attribution(model, images)


@pytest.mark.parametrize("model_name", ["lkat", "rbfkat", "vit5"])
def test_heads_split_each_attention_contribution(model_name, lkat, images):
    names = {"rbfkat": "rbfkat_tiny_patch16_224", "vit5": "vit5_micro"}
    model = lkat if model_name == "lkat" else small(names[model_name])
    dla = direct_logit_attribution(model, images, heads=True)
    depth, heads = len(model.blocks), model.blocks[0].attn.num_heads
    assert dla.head_contributions.shape == (2, depth, heads, dla.contributions.shape[-1])
    _, cache = model.run_with_cache(images)
    final, norm, row = cache["resid_post", depth - 1].double(), model.norm, model.head.weight.double()[dla.target]

    def direct(write: torch.Tensor) -> torch.Tensor:  # through the final norm frozen at this run, then the head
        if isinstance(norm, torch.nn.LayerNorm):
            sigma = torch.sqrt(final.var(-1, unbiased=False, keepdim=True) + norm.eps)
            through = (write - write.mean(-1, keepdim=True)) / sigma * norm.weight.double()
        else:
            through = write / torch.sqrt(final.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight.double()
        return torch.einsum("btd,bd->bt", through, row)

    for i in range(depth):
        attn = model.blocks[i].attn
        proj = attn.o_proj if model_name == "lkat" else attn.proj
        scale = getattr(model.blocks[i], "gamma_1", torch.ones(())).double()  # ViT-5's LayerScale
        seen = []
        handle = proj.register_forward_pre_hook(lambda m, args, seen=seen: seen.append(args[0].double()))
        with torch.no_grad():
            model(images)
        handle.remove()
        width = proj.in_features // heads
        for h in range(heads):  # head h's write: its slice of the projection's input through its weight columns
            write = seen[0][..., h * width : (h + 1) * width] @ proj.weight.double()[:, h * width : (h + 1) * width].T
            write = write * scale
            assert_close(dla.head_contributions[:, i, h], direct(write), rtol=0, atol=1e-5)
        rest = dla.contributions[:, 1 + 2 * i] - dla.head_contributions[:, i].sum(1)  # the projection's bias
        bias = torch.zeros_like(final) if proj.bias is None else (scale * proj.bias.double()).expand_as(final)
        assert_close(rest, direct(bias), rtol=0, atol=1e-5)
