"""The patch embedding's matmul on CUDA against timm's convolution, in a model and under autocast."""

from __future__ import annotations

import pytest
import torch
from tolerance import rel_max

import lkat_lens

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _run(model: torch.nn.Module, x: torch.Tensor, hooked: bool) -> list[torch.Tensor]:
    """The patch tokens and the gradients of the conv weight and bias; `hooked` puts a no-op forward hook on proj,
    which keeps timm's convolution."""
    embed = model.patch_embed
    handle = embed.proj.register_forward_hook(lambda *_: None) if hooked else None
    embed.zero_grad(set_to_none=True)
    tokens = embed(x)
    tokens.float().square().sum().backward()
    if handle is not None:
        handle.remove()
    return [tokens.detach().float(), embed.proj.weight.grad, embed.proj.bias.grad]


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_matmul_matches_the_convolution_in_lkat_s(autocast: bool) -> None:
    """LKAT-S's embedding of 224² images on CUDA takes the matmul and gives the convolution's tokens and weight
    gradients: to fp32 rounding (TF32 off), to bf16 rounding under autocast."""
    model = lkat_lens.create_model("lkat_small_patch16_224", num_classes=10).cuda()
    x = torch.randn(8, 3, 224, 224, device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    assert model.patch_embed.takes_matmul(x)
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            conv, matmul = _run(model, x, hooked=True), _run(model, x, hooked=False)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    tol = 3e-2 if autocast else 1e-5
    for got, want in zip(matmul, conv, strict=True):
        assert rel_max(got, want) < tol
