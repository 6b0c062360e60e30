"""models.patch_embed: timm's patch embedding with its convolution as one matmul over the patches (on CUDA)."""

from __future__ import annotations

import torch
from timm.layers import PatchEmbed as TimmPatchEmbed
from tolerance import rel_max

import lkat_lens
from lkat_lens.models.patch_embed import PatchEmbed


def _embed(dtype: torch.dtype = torch.float64, img_size=(48, 32), **kwargs) -> PatchEmbed:
    torch.manual_seed(0)
    embed = PatchEmbed(img_size, 16, 3, 8, **kwargs).to(dtype)
    with torch.no_grad():
        embed.proj.bias.normal_()
    return embed


def _timm_forward(embed: PatchEmbed, x: torch.Tensor) -> torch.Tensor:
    """timm's own forward (the convolution) on an embedding of this class."""
    return TimmPatchEmbed.forward(embed, x)


def _outputs_and_grads(fn, embed: PatchEmbed, x: torch.Tensor) -> list[torch.Tensor]:
    embed.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    y = fn(x)
    y.float().square().sum().backward()
    return [y.detach(), x.grad, embed.proj.weight.grad, embed.proj.bias.grad]


def test_patch_matmul_is_the_convolution_in_fp64() -> None:
    """On a 48 x 32 image (3 x 2 patches of 16): tokens and the gradients of the image, the weight and the bias as the
    convolution's (timm's forward), to fp64 rounding."""
    embed = _embed()
    x = torch.randn(2, 3, 48, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    conv = _outputs_and_grads(lambda t: _timm_forward(embed, t), embed, x)
    matmul = _outputs_and_grads(embed.patch_matmul, embed, x)
    assert matmul[0].shape == (2, 6, 8)
    for got, want in zip(matmul, conv, strict=True):
        assert rel_max(got, want) < 1e-12


def test_patch_matmul_under_autocast_returns_the_autocast_dtype() -> None:
    """Under bf16 autocast (CPU) the tokens are bf16, as the convolution's, and within bf16 rounding of them."""
    embed = _embed(torch.float32)
    x = torch.randn(2, 3, 48, 32, generator=torch.Generator().manual_seed(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        conv, matmul = _timm_forward(embed, x), embed.patch_matmul(x)
    assert conv.dtype == matmul.dtype == torch.bfloat16
    assert rel_max(matmul, conv) < 2e-2


def test_takes_matmul_only_where_it_is_the_convolution() -> None:
    """The model's size, unhooked: yes. Another size (timm raises on it), a hook on proj, or overlapping patches:
    no."""
    embed = _embed(torch.float32)
    assert embed.takes_matmul(torch.zeros(1, 3, 48, 32))
    assert not embed.takes_matmul(torch.zeros(1, 3, 32, 32))
    handle = embed.proj.register_forward_hook(lambda *_: None)
    assert not embed.takes_matmul(torch.zeros(1, 3, 48, 32))
    handle.remove()
    embed.proj.stride = (8, 8)
    assert not embed.takes_matmul(torch.zeros(1, 3, 48, 32))
    loose = _embed(torch.float32, strict_img_size=False)
    assert loose.takes_matmul(torch.zeros(1, 3, 64, 16)) and not loose.takes_matmul(torch.zeros(1, 3, 40, 32))


def test_on_cpu_the_forward_is_timms() -> None:
    """On a CPU the forward is timm's convolution itself; the flat ViTs embed through this class."""
    embed = _embed(torch.float32)
    x = torch.randn(1, 3, 48, 32)
    assert torch.equal(embed(x), _timm_forward(embed, x))
    assert isinstance(lkat_lens.create_model("lkat_micro", num_classes=10).patch_embed, PatchEmbed)
