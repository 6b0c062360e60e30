"""timm's patch embedding with its non-overlapping convolution run as one matmul over the image's patches on CUDA.

A 16x16 convolution with stride 16 is a GEMM over the image cut into patches: [B, N, C * 16 * 16] @ W^T, W the conv
weight flattened. cuDNN runs the 3-channel convolution on a kernel without tensor cores, with cudnn.benchmark too: at
LKAT-S's 224² batch (128 images, 384 channels, bf16) 0.92 ms forward and 1.57 ms with the weight gradient on an H100,
against 0.14 and 0.28 ms as a reshape and F.linear, one copy and one cuBLAS GEMM each way
(`benchmarks/bench_patch_embed.py`). The parameters (`proj`, a Conv2d) and the output are timm's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import PatchEmbed as TimmPatchEmbed

from lkat_lens.kernels.dtypes import autocast_dtype


class PatchEmbed(TimmPatchEmbed):
    """timm's PatchEmbed; on CUDA its convolution runs as `patch_matmul` where it is one (kernel = stride, no
    padding, tokens flattened, the image a whole number of patches of the size timm checks) and no forward
    (pre-)hook sits on `proj` (a hooked convolution runs, so that the hook fires)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and self.takes_matmul(x):
            return self.norm(self.patch_matmul(x))
        return TimmPatchEmbed.forward(self, x)  # not super(): see hooks.is_hooked

    def takes_matmul(self, x: torch.Tensor) -> bool:
        """Whether the convolution of images x [B, C, H, W] is `patch_matmul` (the device aside)."""
        proj, (height, width) = self.proj, x.shape[-2:]
        if proj._forward_hooks or proj._forward_pre_hooks or not self.flatten or self.dynamic_img_pad:
            return False
        if tuple(proj.stride) != tuple(proj.kernel_size) or any(proj.padding) or proj.groups != 1:
            return False
        if self.img_size is not None and self.strict_img_size:
            return (height, width) == tuple(self.img_size)  # timm's own forward raises on the other sizes
        return height % proj.kernel_size[0] == 0 and width % proj.kernel_size[1] == 0

    def patch_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """The patch tokens [B, N, D] of images x [B, C, H, W] (H, W whole numbers of patches): x cut into patches
        (row-major over the grid, channel-major within a patch, the conv weight's order) times the flattened
        weight, in the dtype the convolution returns (the autocast dtype under autocast)."""
        (ph, pw), (B, C, H, W) = self.proj.kernel_size, x.shape
        patches = x.to(autocast_dtype(x)).reshape(B, C, H // ph, ph, W // pw, pw)
        patches = patches.permute(0, 2, 4, 1, 3, 5).reshape(B, (H // ph) * (W // pw), C * ph * pw)
        return F.linear(patches, self.proj.weight.flatten(1), self.proj.bias)
