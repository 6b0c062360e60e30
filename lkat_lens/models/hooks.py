"""Hook points (TransformerLens style): named identity modules that analyses read and patch."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
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
        return bool(self._forward_hooks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return self.name


class ActivationCache(Mapping):
    """Cached activations, indexed by full hook name or by (short name, block index)."""

    def __init__(self, store: dict[str, torch.Tensor]) -> None:
        self._store = store

    def __getitem__(self, key: str | tuple[str, int]) -> torch.Tensor:
        return self._store[self.resolve(key)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._store)

    def __len__(self) -> int:
        return len(self._store)

    def resolve(self, key: str | tuple[str, int]) -> str:
        """Return the full hook name for a key such as "blocks.0.attn.hook_q" or ("hook_q", 0)."""
        if isinstance(key, str):
            if key in self._store:
                return key
            raise KeyError(f"no cached activation {key!r}; cached: {sorted(self._store)}")
        short, block = key
        return resolve_short_name(self._store, short, block)

    def to(self, device: torch.device | str) -> ActivationCache:
        """Return a copy with every tensor on `device`."""
        return ActivationCache({k: v.to(device) for k, v in self._store.items()})


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
        names: NameFilter = None,
        device: torch.device | str | None = None,
        grad: bool = False,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, ActivationCache]:
        """Run a forward pass and return (output, cache of the selected hook activations).

        Tensors are detached and moved to `device` (the model stays where it is) unless
        `grad=True`, which keeps them in the autograd graph and enables gradients.
        """
        selected = self.select_hooks(names)
        store: dict[str, torch.Tensor] = {}

        def save(tensor: torch.Tensor, hook: HookPoint) -> None:
            kept = tensor if grad else tensor.detach()
            store[hook.name] = kept.to(device) if device is not None else kept

        chosen = set(selected)
        with torch.set_grad_enabled(grad), self.hooks(fwd_hooks=[(chosen.__contains__, save)]):
            out = self(*args, **kwargs)
        return out, ActivationCache({n: store[n] for n in selected if n in store})


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
