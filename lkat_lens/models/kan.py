"""RBF-KAN layers: Gaussian radial bases on a fixed grid, in three parameterisations."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lkat_lens.kernels.kan_linear import edge_kan_linear, kan_linear, kan_pair, kan_pair_graphs
from lkat_lens.kernels.rbf import check_grid, rbf_basis

from .hooks import HookPoint

KAN_BASES = ("shared", "channel", "edge")


class RadialBasis(nn.Module):
    """The fixed grid: centers linspace(grid_min, grid_max, G), bandwidth h = spacing."""

    def __init__(self, grid_min: float, grid_max: float, num_grids: int) -> None:
        super().__init__()
        check_grid(grid_min, grid_max, num_grids)
        self.grid_min, self.grid_max, self.num_grids = float(grid_min), float(grid_max), int(num_grids)
        self.register_buffer("grid", torch.linspace(grid_min, grid_max, num_grids))

    @property
    def bandwidth(self) -> float:
        """h = (grid_max - grid_min) / (G - 1)."""
        return (self.grid_max - self.grid_min) / (self.num_grids - 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The basis vector phi(x) [..., G] (materialised; for the edge basis and analyses)."""
        return rbf_basis(x, self.grid_min, self.grid_max, self.num_grids)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        """Refuse a stored grid that is not the uniform grid this layer's grid_min/grid_max/num_grids describe."""
        stored = state_dict.get(prefix + "grid")
        if stored is not None and (
            stored.shape != self.grid.shape
            or not torch.allclose(stored.double(), self.grid.double(), rtol=0, atol=1e-6)
        ):
            raise ValueError(
                f"{prefix}grid holds {[round(v, 6) for v in stored.flatten().tolist()]}, not the uniform grid "
                f"linspace({self.grid_min}, {self.grid_max}, {self.num_grids}) = {self.grid.tolist()}"
            )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"grid=[{self.grid_min}, {self.grid_max}], num_grids={self.num_grids}"


class KANLayer(nn.Module):
    """One RBF-KAN layer: y_q = sum_p phi_{q,p}(x_p) (+ optional SiLU base branch and gated residual).

    basis "shared":  phi_{q,p}(x) = W[q,p] * sum_g w_g phi_g(x)      (grid_linear [1,G], dim_linear [out,in])
    basis "channel": phi_{q,p}(x) = W[q,p] * sum_g w_{p,g} phi_g(x)  (grid_weight [in,G], dim_linear [out,in])
    basis "edge":    phi_{q,p}(x) = sum_g W[q,p,g] phi_g(x)         (spline_linear [out, in*G], FastKAN)

    kernel_backend: "auto" (CUDA: the fastest correct path per layer shape, measured once; elsewhere torch),
    "torch", "triton" (elementwise RBF kernel + cuBLAS; the edge basis has only the fused kernels) or
    "fused" (the basis evaluated inside the matmul kernels, only x saved for backward).

    What analyses read (nothing else of a layer; docs/architecture.md): in_features, out_features, basis, the hook
    points hook_in/hook_out, the grid (grid_min, grid_max, num_grids, bandwidth, centers), basis_values,
    spline_coefficients, spline_factors, base_weight, gate_weight, edge_input, gated_contribution, branch_outputs.
    """

    SELF_INITIALISED = ("grid_linear", "dim_linear", "spline_linear", "base_linear")

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        num_grids: int = 4,
        grid_min: float = -2.0,
        grid_max: float = 2.0,
        basis: str = "shared",
        use_layernorm: bool = False,
        use_base_update: bool = False,
        gated: bool = False,
    ) -> None:
        super().__init__()
        if basis not in KAN_BASES:
            raise ValueError(f"unknown KAN basis {basis!r}; choose from {KAN_BASES}")
        self.in_features, self.out_features, self.basis = in_features, out_features, basis
        self.layernorm = nn.LayerNorm(in_features) if use_layernorm else None
        self.rbf = RadialBasis(grid_min, grid_max, num_grids)
        scale = 1.0 / (num_grids * in_features)
        if basis == "edge":
            self.spline_linear = nn.Linear(in_features * num_grids, out_features, bias=False)
            nn.init.trunc_normal_(self.spline_linear.weight, std=(in_features * num_grids) ** -0.5)
        else:
            if basis == "shared":
                self.grid_linear = nn.Linear(num_grids, 1, bias=False)
                nn.init.trunc_normal_(self.grid_linear.weight, std=scale)
            else:
                self.grid_weight = nn.Parameter(torch.empty(in_features, num_grids))
                nn.init.trunc_normal_(self.grid_weight, std=scale)
            self.dim_linear = nn.Linear(in_features, out_features, bias=False)
            nn.init.trunc_normal_(self.dim_linear.weight, std=scale)
        self.base_linear = nn.Linear(in_features, out_features) if use_base_update else None
        self.gat_resid = nn.Linear(in_features, out_features) if gated else None
        self.kernel_backend = "auto"
        self.hook_in = HookPoint()
        self.hook_out = HookPoint()

    @property
    def grid_weights(self) -> torch.Tensor:
        """The per-curve grid weights: [1, G] (shared) or [in, G] (channel)."""
        return self.curve_weights()

    def curve_weights(self) -> torch.Tensor:
        """`grid_weights` as a method, for forward: torch.compile's guards skip an unchanged module only where the
        traced code reads no property (see hooks.is_hooked)."""
        return self.grid_linear.weight if self.basis == "shared" else self.grid_weight

    # ------------------------------------------------------------------ what analyses read (docs/architecture.md)

    @property
    def grid_min(self) -> float:
        """The first grid center."""
        return self.rbf.grid_min

    @property
    def grid_max(self) -> float:
        """The last grid center."""
        return self.rbf.grid_max

    @property
    def num_grids(self) -> int:
        """G, the number of Gaussians."""
        return self.rbf.num_grids

    @property
    def bandwidth(self) -> float:
        """h = (grid_max - grid_min) / (G - 1), the grid spacing and every Gaussian's width."""
        return self.rbf.bandwidth

    @property
    def centers(self) -> torch.Tensor:
        """The grid centers c_g [G] (detached; on the layer's device, in its dtype)."""
        return self.rbf.grid.detach()

    def basis_values(self, x: torch.Tensor) -> torch.Tensor:
        """The Gaussian basis phi_g(x) [..., G] in float64, from the kernels' one definition (kernels.rbf)."""
        return rbf_basis(x.double(), self.grid_min, self.grid_max, self.num_grids)

    def spline_coefficients(self, q: torch.Tensor | slice, p: torch.Tensor | slice | None = None) -> torch.Tensor:
        """Basis coefficients c_{q,p,g} (float64, detached) of the spline part phi_{q,p}(x) = sum_g c_{q,p,g}
        phi_g(x): of the edges (q[i], p[i]) as [E, G], or of the output rows `q` (a slice) as [r, in, G]."""
        if self.basis == "edge":
            weight = self.spline_linear.weight.detach().view(self.out_features, self.in_features, -1)
            return (weight[q] if p is None else weight[q, p]).double()
        scale, curves = self.spline_factors()
        if p is None:
            return scale[q].unsqueeze(-1) * curves.expand(self.in_features, -1)
        return scale[q, p].unsqueeze(-1) * curves.expand(self.in_features, -1)[p]

    def spline_factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The factorised spline (shared/channel bases): edge scales W [out, in] and curve weights [1 or in, G],
        float64 and detached, so that c_{q,p,g} = W[q,p] w_{p,g}. The edge basis has no such form."""
        if self.basis == "edge":
            raise ValueError("the edge basis is not factorised: read spline_coefficients()")
        return self.dim_linear.weight.detach().double(), self.grid_weights.detach().double()

    @property
    def base_weight(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The SiLU base branch's (weight [out, in], bias [out]), float64 and detached; None without one."""
        if self.base_linear is None:
            return None
        return self.base_linear.weight.detach().double(), self.base_linear.bias.detach().double()

    @property
    def gate_weight(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The gated residual's (weight [out, in], bias [out]), float64 and detached; None without one."""
        if self.gat_resid is None:
            return None
        return self.gat_resid.weight.detach().double(), self.gat_resid.bias.detach().double()

    def edge_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the edge functions read of the raw layer input x: x after the optional LayerNorm (hook_in's value),
        detached."""
        with torch.no_grad():
            return self.layernorm(x) if self.layernorm is not None else x.detach()

    def gated_contribution(self, x: torch.Tensor) -> torch.Tensor:
        """The gated residual's term gamma sigmoid(gamma), gamma = W x + b, of the raw layer input x (float64)."""
        with torch.no_grad():
            gamma = self.gat_resid(x.to(self.gat_resid.weight.dtype)).double()
        return gamma * torch.sigmoid(gamma)

    def branch_outputs(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The layer output [..., out] of raw input x split by branch, float64 and detached: "spline" (sum_p
        phi_{q,p}(x_p) on edge_input(x)), then "base" (W_b silu(x) + b) and "gated" when the layer has them. They
        sum to forward(x) up to rounding."""
        phi = self.basis_values(self.edge_input(x))
        coefficients = self.spline_coefficients(slice(None))
        out = {"spline": phi.flatten(-2) @ coefficients.flatten(1).T}
        if self.base_weight is not None:
            out["base"] = F.linear(F.silu(x.detach().double()), *self.base_weight)
        if self.gate_weight is not None:
            out["gated"] = self.gated_contribution(x)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_in = self.hook_in(self.layernorm(x) if self.layernorm is not None else x)
        rbf = self.rbf
        grid = (rbf.grid_min, rbf.grid_max)
        if self.basis == "edge":
            y = edge_kan_linear(x_in, self.spline_linear.weight, *grid, rbf.num_grids, backend=self.kernel_backend)
        else:
            y = kan_linear(x_in, self.curve_weights(), self.dim_linear.weight, *grid, backend=self.kernel_backend)
        if self.base_linear is not None:
            y = y + self.base_linear(F.silu(x))
        if self.gat_resid is not None:
            gamma = self.gat_resid(x)
            y = y + gamma * torch.sigmoid(gamma)
        return self.hook_out(y)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, basis={self.basis}"


class KAN(nn.Module):
    """The two-layer RBF-KAN that replaces a transformer block's MLP.

    `eager_graphs` (False by default; LKAT.set_backends): on CUDA outside torch.compile, both layers run as one
    computation replayed as CUDA graphs from an input shape's second call on (`kernels.kan_linear.kan_pair`: the
    layers' "triton" path, the hidden activation kept inside the graph), when nothing needs them apart (`pairs`)."""

    def __init__(self, dim: int, hidden_dim: int, *, drop: float = 0.0, **layer_kwargs) -> None:
        super().__init__()
        self.fc1 = KANLayer(dim, hidden_dim, **layer_kwargs)
        self.fc2 = KANLayer(hidden_dim, dim, **layer_kwargs)
        self.drop = nn.Dropout(drop)
        self.eager_graphs = False
        self._graphs = kan_pair_graphs()  # kan_pair's CUDA-graph captures (eager_graphs)

    def pairs(self, x: torch.Tensor) -> bool:
        """Whether this input takes kan_pair as CUDA graphs: eager on CUDA; both layers plain shared/channel layers
        (no layer norm, base or gated branch) on the "auto" or "triton" path; no hook on them, their hook points or
        their submodules; no dropout between them."""
        if torch.compiler.is_compiling() or not (self.eager_graphs and x.is_cuda):
            return False
        layers = (self.fc1, self.fc2)
        plain = all(
            m.basis != "edge" and m.kernel_backend in ("auto", "triton") and m.layernorm is None
            and m.base_linear is None and m.gat_resid is None for m in layers
        )  # fmt: skip
        unhooked = not any(m._forward_hooks or m._forward_pre_hooks for layer in layers for m in layer.modules())
        return plain and unhooked and not (self.drop.p and self.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pairs(x):
            layers = [
                (m.curve_weights(), m.dim_linear.weight, m.rbf.grid_min, m.rbf.grid_max) for m in (self.fc1, self.fc2)
            ]
            return kan_pair(x, *layers, graphs=self._graphs)
        return self.drop(self.fc2(self.drop(self.fc1(x))))
