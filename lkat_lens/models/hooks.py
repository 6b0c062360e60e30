"""Hook points (TransformerLens style): named identity modules that analyses read and patch."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from timm.models._features import feature_take_indices
from torch import nn

HookFn = Callable[[torch.Tensor, "HookPoint"], torch.Tensor | None]
NameFilter = str | Iterable[str] | Callable[[str], bool] | None

_BLOCK_RE = re.compile(r"^blocks\.(\d+)\.(.+)$")


class HookPoint(nn.Module):
    """An identity module whose output can be read or replaced by hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.name = ""

    @property
    def active(self) -> bool:
        """Whether any forward hook is attached (lets models skip work done only for hooks)."""
        return is_hooked(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return self.name


def is_hooked(point: HookPoint) -> bool:
    """Whether any forward hook is attached to `point` (its `active`). Forward code calls this function rather than
    the property: torch.compile's guards skip an unchanged module's whole subtree only where the traced code reads
    no property (torch._dynamo's recursive dict tags)."""
    return bool(point._forward_hooks)


# TransformerLens activation names that are spelled differently here (its get_act_name), -> our hook suffix
TL_ALIASES = {
    "attn_out": "attn.hook_out",
    "mlp_in": "mlp.fc1.hook_in",
    "mlp_out": "mlp.fc2.hook_out",
    "gate": "attn.hook_gk",
}
GRAD = "_grad"  # a gradient's key: its activation's name + GRAD (TransformerLens's convention)


class ActivationCache(Mapping):
    """Cached activations (and gradients, under "<name>_grad"), TransformerLens style: by full hook name, by
    (short name, block) such as ("resid_post", 3), ("hook_q", 0), ("fc1.hook_out", 2) or ("resid_post_grad", 3),
    a negative block counting from the last."""

    def __init__(self, store: dict[str, torch.Tensor], has_batch_dim: bool = True) -> None:
        self._store = store
        self.has_batch_dim = has_batch_dim

    def __getitem__(self, key: str | tuple[str, int]) -> torch.Tensor:
        return self._store[self.resolve(key)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._store)

    def __len__(self) -> int:
        return len(self._store)

    def __repr__(self) -> str:
        return f"ActivationCache with keys {list(self._store)}"

    @property
    def num_blocks(self) -> int:
        """1 + the highest block index among the cached names (0 when no block is cached)."""
        return 1 + max((b for b in map(block_index, self._store) if b is not None), default=-1)

    def resolve(self, key: str | tuple[str, int]) -> str:
        """The full name for a key such as "blocks.0.attn.hook_q", ("q", 0), ("resid_post", -1), ("q_grad", 0)."""
        if isinstance(key, str):
            if key in self._store:
                return key
            raise KeyError(f"no cached activation {key!r}; cached: {sorted(self._store)}")
        short, block = key
        block = block + self.num_blocks if block < 0 else block
        grad = short.endswith(GRAD)
        short = TL_ALIASES.get(short.removesuffix(GRAD), short.removesuffix(GRAD))
        names = [n.removesuffix(GRAD) for n in self._store if n.endswith(GRAD) == grad]
        return resolve_short_name(names, short, block) + (GRAD if grad else "")

    def stack_activation(self, name: str, layer: int = -1) -> torch.Tensor:
        """The activation `name` of blocks 0 .. layer-1 (all blocks for layer=-1) stacked: [blocks, ...]."""
        count = self.num_blocks if layer == -1 else layer
        return torch.stack([self[name, block] for block in range(count)])

    def accumulated_resid(self, layer: int | None = None, incl_mid: bool = False) -> torch.Tensor:
        """The residual stream before each of the first `layer` blocks (all, then the last block's output, when
        None), with each block's mid-point too when `incl_mid`: [points, ...]."""
        count = self.num_blocks if layer is None else layer
        points = []
        for block in range(count):
            points.append(self["resid_pre", block])
            if incl_mid:
                points.append(self["resid_mid", block])
        if layer is None:
            points.append(self["resid_post", count - 1])
        return torch.stack(points)

    def remove_batch_dim(self) -> ActivationCache:
        """Drop the batch dimension of every tensor (a cache of one input only); returns the cache itself."""
        if self.has_batch_dim:
            sizes = {name: t.shape[0] for name, t in self._store.items() if t.shape[0] != 1}
            if sizes:
                raise ValueError(f"remove_batch_dim needs a batch of one; {next(iter(sizes))!r} has {sizes}")
            self._store = {name: t[0] for name, t in self._store.items()}
            self.has_batch_dim = False
        return self

    def to(self, device: torch.device | str) -> ActivationCache:
        """Return a copy with every tensor on `device`."""
        return ActivationCache({k: v.to(device) for k, v in self._store.items()}, self.has_batch_dim)


def resolve_short_name(names: Iterable[str], short: str, block: int) -> str:
    """Find the one hook of block `block` whose name ends with `short` (e.g. "hook_q", "fc1.hook_in")."""
    wanted = short if short.split(".")[-1].startswith("hook_") else _with_hook_prefix(short)
    prefix = f"blocks.{block}."
    matches = [n for n in names if n.startswith(prefix) and (n == prefix + wanted or n.endswith("." + wanted))]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise KeyError(f"no hook {short!r} in block {block}")
    raise KeyError(f"{short!r} is ambiguous in block {block}: {matches}")


def _with_hook_prefix(short: str) -> str:
    parts = short.split(".")
    parts[-1] = "hook_" + parts[-1]
    return ".".join(parts)


class HookedModel(nn.Module):
    """Mixin for models with HookPoints: list_hooks, hooks(...) and run_with_cache(...)."""

    def setup_hooks(self) -> None:
        """Give every HookPoint its full module name; call at the end of __init__."""
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name

    def hook_points(self) -> dict[str, HookPoint]:
        """All hook points by full name, in forward order of definition."""
        return {n: m for n, m in self.named_modules() if isinstance(m, HookPoint)}

    def list_hooks(self) -> list[str]:
        """Names of all hook points."""
        return list(self.hook_points())

    def select_hooks(self, names: NameFilter = None) -> list[str]:
        """Resolve a name filter (None = all, an exact name, a prefix, a list of names, a predicate)."""
        available = self.hook_points()
        if names is None:
            return list(available)
        if callable(names):
            return [n for n in available if names(n)]
        if isinstance(names, str):
            if names in available:
                return [names]
            picked = [n for n in available if n.startswith(names)]
            if not picked:
                raise KeyError(f"no hook point matches {names!r}; see model.list_hooks()")
            return picked
        names = list(names)
        unknown = [n for n in names if n not in available]
        if unknown:
            raise KeyError(f"unknown hook points {unknown}; see model.list_hooks()")
        return names

    @contextmanager
    def hooks(
        self,
        fwd_hooks: Iterable[tuple[str | Callable[[str], bool], HookFn]] = (),
        bwd_hooks: Iterable[tuple[str | Callable[[str], bool], HookFn]] = (),
    ) -> Iterator[HookedModel]:
        """Attach hooks fn(tensor, hook) -> tensor|None for the duration of a with-block."""
        points = self.hook_points()
        handles: list[Any] = []
        try:
            for selector, fn in fwd_hooks:
                for name in self.select_hooks(selector):
                    handles.append(points[name].register_forward_hook(_forward_adapter(fn)))
            for selector, fn in bwd_hooks:
                for name in self.select_hooks(selector):
                    handles.append(points[name].register_forward_hook(_backward_adapter(fn)))
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def run_with_cache(
        self,
        *args: Any,
        names_filter: NameFilter = None,
        device: torch.device | str | None = None,
        incl_bwd: bool = False,
        metric: Callable[[torch.Tensor], torch.Tensor] | None = None,
        remove_batch_dim: bool = False,
        grad: bool = False,
        names: NameFilter = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, ActivationCache]:
        """Run a forward pass and return (output, ActivationCache of the hook points `names_filter` selects).

        Tensors are detached and moved to `device` (the model stays where it is). `incl_bwd=True` also runs the
        backward pass of `metric(output)` (default: the output itself, which must then be a scalar) and caches each
        selected hook's gradient as "<name>_grad". `grad=True` instead keeps the activations in the autograd graph
        (for torch.autograd.grad of your own). `names` is `names_filter`'s older spelling.
        """
        if names is not None and names_filter is not None:
            raise TypeError("pass names_filter or names, not both")
        chosen = set(self.select_hooks(names_filter if names_filter is not None else names))
        store: dict[str, torch.Tensor] = {}

        def save(tensor: torch.Tensor, hook: HookPoint) -> None:
            kept = tensor if grad else tensor.detach()
            store[hook.name] = kept.to(device) if device is not None else kept

        def save_grad(tensor: torch.Tensor, hook: HookPoint) -> None:
            store[hook.name + GRAD] = tensor.detach().to(device) if device is not None else tensor.detach()

        backward = [(chosen.__contains__, save_grad)] if incl_bwd else []
        with torch.set_grad_enabled(grad or incl_bwd), self.hooks([(chosen.__contains__, save)], backward):
            out = self(*args, **kwargs)
            if incl_bwd:
                value = out if metric is None else metric(out)
                if value.numel() != 1:
                    raise ValueError(
                        f"incl_bwd needs a scalar to differentiate; the output is {tuple(value.shape)}: "
                        "pass metric=, e.g. lambda logits: logits[:, label].sum()"
                    )
                value.backward()
        order = [n for n in self.hook_points() if n in chosen]
        cache = ActivationCache({n + tag: store[n + tag] for tag in ("", GRAD) for n in order if n + tag in store})
        return (out.detach() if incl_bwd else out), (cache.remove_batch_dim() if remove_batch_dim else cache)

    def run_with_hooks(
        self,
        *args: Any,
        fwd_hooks: Iterable[tuple[str | Callable[[str], bool], HookFn]] = (),
        bwd_hooks: Iterable[tuple[str | Callable[[str], bool], HookFn]] = (),
        **kwargs: Any,
    ) -> Any:
        """One forward pass with the hooks attached (TransformerLens's run_with_hooks): each fn(tensor, hook)
        may return a replacement. Forward hooks are removed when it returns; backward hooks stay on the output's
        graph, so they fire when you call .backward() on it."""
        with self.hooks(fwd_hooks, bwd_hooks):
            return self(*args, **kwargs)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        norm: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        return_prefix_tokens: bool = False,
        stop_early: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list]:
        """timm's forward_intermediates: the residual stream after the blocks `indices` (all; the last n for an
        int; negative indices count from the end), read at their hook_resid_post, as patch maps [B, D, gh, gw]
        (output_fmt "NCHW") or tokens [B, N, D] ("NLC"), through the final norm when `norm`. Returns the list, or
        (final features, list); `return_prefix_tokens` pairs each with its non-patch tokens (registers, class
        token). The whole forward always runs (`stop_early` is accepted for timm's signature)."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, _ = feature_take_indices(len(self.blocks), indices)
        wanted = {f"blocks.{i}.hook_resid_post" for i in take}
        found: dict[str, torch.Tensor] = {}

        def keep(tensor: torch.Tensor, hook: HookPoint) -> None:
            found[hook.name] = tensor

        with self.hooks([(wanted.__contains__, keep)]):
            final = self.forward_features(x)
        layout, (gh, gw) = self.token_layout, self.patch_embed.grid_size
        prefix = [i for i in range(final.shape[1]) if i not in range(*layout["patches"].indices(final.shape[1]))]
        outputs: list = []
        for i in take:
            tokens = found[f"blocks.{i}.hook_resid_post"]
            tokens = self.norm(tokens) if norm else tokens
            patches = tokens[:, layout["patches"]]
            if output_fmt == "NCHW":
                patches = patches.reshape(patches.shape[0], gh, gw, -1).permute(0, 3, 1, 2)
            outputs.append((patches, tokens[:, prefix]) if return_prefix_tokens else patches)
        return outputs if intermediates_only else (final, outputs)


def _forward_adapter(fn: HookFn) -> Callable[..., Any]:
    def hook(module: HookPoint, args: tuple[Any, ...], output: torch.Tensor) -> Any:
        return fn(output, module)

    return hook


def _backward_adapter(fn: HookFn) -> Callable[..., Any]:
    def hook(module: HookPoint, args: tuple[Any, ...], output: torch.Tensor) -> None:
        if output.requires_grad:
            output.register_hook(lambda grad: fn(grad, module))

    return hook


def block_index(name: str) -> int | None:
    """The block number in a hook name such as "blocks.3.attn.hook_q", else None."""
    match = _BLOCK_RE.match(name)
    return int(match.group(1)) if match else None
