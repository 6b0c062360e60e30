"""LKAT (GLA + RBF-KAN) and rbfKAT (MHSA + RBF-KAN): flat ViTs with registers and a last class token.

Every option of the reference code's LKAT / KATT that changes the computation is a keyword here: `rope_mode`,
`rope_theta`, `use_cls_token` (without it the head reads the mean of the patch tokens), `use_abs_pos`,
`num_registers`, GLA's `use_short_conv`, `conv_size`, `expand_k`, `expand_v`, and dropout where the
reference applies it: `drop_rate` after the position embedding, on the token mixer's output and after each KAN
layer; `attn_drop_rate` on GLA's output (before the `drop_rate` dropout) or on MHSA's attention probabilities.
"""

from __future__ import annotations

import torch
from timm.layers import DropPath, RmsNorm
from torch import nn

from .attention import PATH_MODES, VisionGLA, VisionMHSA, check_input_mode
from .flat_vit import FlatViT
from .hooks import HookPoint
from .kan import KAN, KANLayer

NORMS = {"layernorm": nn.LayerNorm, "rmsnorm": lambda dim: RmsNorm(dim, eps=1e-6)}


class KANBlock(nn.Module):
    """Pre-norm block: x + attn(norm1(x)), then x + mlp(norm2(x)), with DropPath and hook points."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        grid: tuple[int, int],
        *,
        mlp_hidden: int,
        token_mixer: str,
        norm: str,
        kan_kwargs: dict,
        mixer_kwargs: dict,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        attn_mode: str = "auto",
    ) -> None:
        super().__init__()
        self.norm1 = NORMS[norm](dim)
        if token_mixer == "gla":
            self.attn = VisionGLA(dim, num_heads, grid, mode=attn_mode, **mixer_kwargs)
            self.attn_drop = nn.Dropout(attn_drop) if attn_drop > 0 else nn.Identity()
        else:
            self.attn = VisionMHSA(dim, num_heads, grid, attn_drop=attn_drop, **mixer_kwargs)
            self.attn_drop = nn.Identity()  # MHSA drops attention probabilities itself
        self.proj_drop = nn.Dropout(drop) if drop > 0 else nn.Identity()
        self.norm2 = NORMS[norm](dim)
        self.mlp = KAN(dim, mlp_hidden, drop=drop, **kan_kwargs)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.hook_resid_pre, self.hook_resid_mid, self.hook_resid_post = HookPoint(), HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        mixed = self.proj_drop(self.attn_drop(self.attn(self.norm1(x))))
        x = self.hook_resid_mid(x + self.drop_path(mixed))
        return self.hook_resid_post(x + self.drop_path(self.mlp(self.norm2(x))))


class LKAT(FlatViT):
    """Linear Kolmogorov-Arnold Transformer. Tokens: [patches (N), registers (R), class token (if any)]."""

    token_mixer = "gla"
    norm_type = "layernorm"
    TOKENS = ("pos_embed", "cls_token", "register_tokens")

    def __init__(
        self,
        img_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 384,
        depth: int = 12,
        num_heads: int = 6,
        mlp_ratio: float = 4.0,
        num_registers: int = 4,
        kan_num_grids: int = 4,
        kan_grid_min: float = -2.0,
        kan_grid_max: float = 2.0,
        kan_basis: str = "shared",
        kan_gated: bool = False,
        kan_layernorm: bool = False,
        kan_base_update: bool = False,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        use_cls_token: bool = True,
        use_abs_pos: bool = True,
        rope_mode: str = "2dv1",
        rope_theta: float = 10000.0,
        use_short_conv: bool = True,
        conv_size: int = 4,
        expand_k: float = 1.0,
        expand_v: float = 1.0,
        attn_mode: str = "auto",
        global_pool: str | None = None,
    ) -> None:
        super().__init__()
        pool = "token" if use_cls_token else "avg"
        if global_pool not in (None, pool):
            raise ValueError(f"this LKAT pools with {pool!r} (use_cls_token={use_cls_token}), not {global_pool!r}")
        if num_registers < 1:
            raise ValueError(f"num_registers must be >= 1, got {num_registers}")
        self.num_registers, self.use_cls_token, self.global_pool = num_registers, bool(use_cls_token), pool
        self._embed_patches(img_size, patch_size, in_chans, embed_dim, num_classes)
        self.register_tokens = nn.Parameter(torch.zeros(1, num_registers, embed_dim))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if use_cls_token else None
        num_tokens = self.num_patches + num_registers + int(self.use_cls_token)
        self.pos_embed = nn.Parameter(torch.zeros(1, num_tokens, embed_dim)) if use_abs_pos else None
        self.pos_drop = nn.Dropout(drop_rate)
        self.hook_embed = HookPoint()
        kan_kwargs = dict(
            num_grids=kan_num_grids,
            grid_min=kan_grid_min,
            grid_max=kan_grid_max,
            basis=kan_basis,
            use_layernorm=kan_layernorm,
            use_base_update=kan_base_update,
            gated=kan_gated,
        )
        mixer_kwargs: dict = dict(rope_mode=rope_mode, rope_theta=rope_theta)
        if self.token_mixer == "gla":
            mixer_kwargs |= dict(
                use_short_conv=use_short_conv, conv_size=conv_size, expand_k=expand_k, expand_v=expand_v
            )
        rates = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.ModuleList(
            KANBlock(
                embed_dim,
                num_heads,
                self.grid_size,
                mlp_hidden=int(embed_dim * mlp_ratio),
                token_mixer=self.token_mixer,
                norm=self.norm_type,
                kan_kwargs=kan_kwargs,
                mixer_kwargs=mixer_kwargs,
                drop=drop_rate,
                attn_drop=attn_drop_rate,
                drop_path=rate,
                attn_mode=attn_mode,
            )
            for rate in rates
        )
        self._finish(NORMS[self.norm_type](embed_dim))

    def _self_initialised(self) -> set[nn.Module]:
        """GLA's layers and the KAN layers' own (the reference initialises them itself)."""
        own_init = {sub for m in self.modules() if isinstance(m, VisionGLA) for sub in m.modules()}
        return own_init | {
            getattr(m, name)
            for m in self.modules()
            if isinstance(m, KANLayer)
            for name in KANLayer.SELF_INITIALISED
            if getattr(m, name, None) is not None
        }

    @property
    def token_layout(self) -> dict[str, slice]:
        """Where each token type sits in the sequence."""
        n, r = self.num_patches, self.num_registers
        layout = {"patches": slice(0, n), "registers": slice(n, n + r)}
        if self.use_cls_token:
            layout["cls"] = slice(n + r, n + r + 1)
        return layout

    def set_backends(
        self,
        attn: str | None = None,
        kan: str | None = None,
        gla_input: str | None = None,
        gla_output: str | None = None,
        gla_gate: str | None = None,
        gla_core: str | None = None,
        cuda_graphs: bool | None = None,
        eager_graphs: bool | None = None,
    ) -> LKAT:
        """Choose the GLA mode (kernels.gla.MODES: auto/chunk/fused_recurrent/short/torch), the KAN layers'
        kernel backend (kernels.kan_linear.BACKENDS: auto/torch/triton/fused), and how GLA's input path, its output
        path, its forget gate and its core (all of them as one op) run (models.attention.INPUT_MODES:
        auto/fused/torch; VisionGLA); cuda_graphs=True before torch.compile(mode="reduce-overhead") keeps the GLA
        core's short kernels as custom ops (VisionGLA.cuda_graphs; faster on the device, slower on the host);
        eager_graphs=True replays the eager GLA cores' and KAN MLPs' kernels on CUDA as CUDA graphs
        (VisionGLA.eager_graphs, KAN.eager_graphs: faster on the host, for memory, each layer's graphs holding its
        activations between steps)."""
        paths = {"gla_input": gla_input, "gla_output": gla_output, "gla_gate": gla_gate, "gla_core": gla_core}
        paths = {name: mode for name, mode in paths.items() if mode is not None}
        for name, mode in paths.items():
            check_input_mode(mode, name)
        for module in self.modules():
            if isinstance(module, VisionGLA):
                if attn is not None:
                    module.mode = attn
                for name, mode in paths.items():
                    setattr(module, PATH_MODES[name], mode)
                if cuda_graphs is not None:
                    module.cuda_graphs = bool(cuda_graphs)
            if kan is not None and isinstance(module, KANLayer):
                module.kernel_backend = kan
            if eager_graphs is not None and isinstance(module, VisionGLA | KAN):
                module.eager_graphs = bool(eager_graphs)
        return self

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images [B, C, H, W] -> tokens [B, N+R(+1), D]: patches, registers, class token, position embedding."""
        x = self.patch_embed(x)
        b = x.shape[0]
        extra = [t.expand(b, -1, -1) for t in (self.register_tokens, self.cls_token) if t is not None]
        x = torch.cat([x, *extra], dim=1)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        return self.pos_drop(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens -> logits, read from the class token (the last one), or the mean of the patch tokens without it."""
        x = x[:, -1] if self.use_cls_token else x[:, : self.num_patches].mean(dim=1)
        return x if pre_logits else self.head(x)


class RbfKAT(LKAT):
    """rbfKAT (the reference's KATT): MHSA + RMSNorm instead of GLA + LayerNorm; KAN grid [-1, 1] with LayerNorm."""

    token_mixer = "mhsa"
    norm_type = "rmsnorm"

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("kan_grid_min", -1.0)
        kwargs.setdefault("kan_grid_max", 1.0)
        kwargs.setdefault("kan_layernorm", True)
        super().__init__(**kwargs)
