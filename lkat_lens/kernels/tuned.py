"""Autotuned Triton kernels launched with the configuration Triton's autotuner chose, without Triton's per-call work.

triton.autotune chooses a configuration on a key's first call (or reads it from Triton's autotuning cache) and then,
on every later call, rebuilds a dict of the arguments, its key and the configuration's keyword arguments before it
launches; Triton's JITFunction.run then binds the arguments, specialises them, builds its cache key and checks the
kernel's globals. In an eager LKAT step, which is bound by the host, cProfile put the launches at about a quarter of
the step (~190 launches a step, H200 machine). A TunedKernel wraps an autotuner: a key's first call goes through it,
the next through JITFunction.run with the chosen configuration, which returns the compiled kernel; later calls start
that compiled kernel directly, as JITFunction.run does (the same arguments, the tensors as their data pointers, grid,
stream and launch hooks).

A key holds what decides the compiled kernel: the keyword arguments and the positional arguments' specialisation
(`specialise`: as Triton computes it, or finer, and so the values of the autotuner's key arguments, which are
integers and flags in every kernel here); a plan's key adds the current device, as Triton's cache of compiled kernels
does. Past `MAX_KEYS` keys a kernel's new keys go through the autotuner and JITFunction.run on every call, so that an
argument that changed on every call could not grow its tables without end.
`DIRECT = False` sends every launch through JITFunction.run (benchmarks/bench_eager_host.py compares both).

While torch.compile traces, a launch is the autotuner's own call, which dynamo records as a user-defined Triton
kernel: inductor then launches it from its generated code (and autotunes it over the same configurations). The
modules look their kernels up in a `kernel_table`, which dynamo can read. Two things such a kernel must not
take: a tuple argument (inductor's code generation takes none; strides go as integers) and a float it does not cast
(inductor passes a Python float as fp64, Triton's own launch as fp32; the kernels cast their float scalars to fp32).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch import Tensor
from triton import knobs
from triton.runtime import driver
from triton.runtime.autotuner import Autotuner

from .host_math import next_power_of_2

DIRECT = True
MAX_KEYS = 256


def programs_key(*counts: int) -> int:
    """An autotuning key argument for how much a launch has to do: the power of two at or above the product of
    `counts` (its programs, or its rows). Which configuration wins (warps, row tiles, a register cap) depends on how
    many programs share the SMs, and Triton's autotuning cache outlives the process: keyed on the shapes alone, a
    tuning made at a test's or an analysis's batch of 2 would serve a training batch of 128."""
    return next_power_of_2(math.prod(counts))


def specialise(args: tuple) -> tuple[tuple, list]:
    """(key, pointers): what Triton's specialisation of these positional arguments depends on, or finer, and the
    arguments as a direct launch passes them, each tensor as its data pointer. The key holds a tensor's dtype and
    16-byte alignment and anything else by its value (an integer's, where Triton keys on its being 1, its divisibility
    by 16 and its width; a float's, where Triton keys on its type; a constexpr's). Given a tensor, Triton's launcher
    calls its data_ptr again and asks the CUDA driver whether the pointer is a device pointer (cuPointerGetAttribute);
    given an integer, it takes it as it is, so the pointers are read once, here. It runs on every launch (~160 an
    eager LKAT-T training step): integers are told by their exact type first and kept as they are, about half the
    time of computing each one's three properties (CPU machine). A kernel's sizes, strides and constants take a few
    values a run; TunedKernel caps the keys it keeps."""
    pointers = [arg if type(arg) is int else arg.data_ptr() if isinstance(arg, Tensor) else arg for arg in args]
    return tuple([p if p is arg else (arg.dtype, not p & 15) for arg, p in zip(args, pointers, strict=True)]), pointers


def kernel_table(keys: Iterable[Any]) -> Callable[[Callable[..., TunedKernel]], Callable[..., TunedKernel]]:
    """Decorator: the kernels build(*key) makes for `keys` (a key that is no tuple is one argument), all made at once
    (a few ms for every module's), and looked up by key. The lookup is a dict read, which dynamo traces while
    torch.compile traces a launch; a builder cached by functools.cache it would trace as if uncached, building an
    Autotuner in the graph, which it cannot."""

    def table(build: Callable[..., TunedKernel]) -> Callable[..., TunedKernel]:
        built = {key: build(*key) for key in (k if isinstance(k, tuple) else (k,) for k in keys)}

        def lookup(*key: Any) -> TunedKernel:
            return built[key]

        return functools.update_wrapper(lookup, build)

    return table


def written_through(out: Tensor, into: tuple[Tensor, int] | None) -> tuple[Tensor, int]:
    """(the tensor a kernel writes `out` through, out's element offset in it): `into` = (the dense tensor out is a
    view of, such as a gradient whose column slice out is, and that offset), else (out, 0). torch.compile copies a
    tensor a traced kernel writes (functionalisation), and inductor copies a non-dense view wrongly (torch 2.11: the
    copy reads the view's whole span from a compact buffer, out of bounds); the caller knows the offset (dynamo traces
    no storage_offset)."""
    return (out, 0) if into is None else into


def _launchable(compiled: Any) -> bool:
    """Whether JITFunction.run returned a compiled kernel this module can start (not None, not a future)."""
    return all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata", "launch_metadata"))


class _Plan(NamedTuple):
    """How a key's calls start their compiled kernel: the compiled kernel, the keyword parameters after the positional
    arguments in the kernel's order (the call's keyword arguments, the chosen configuration's, else the defaults) and
    the same by name, which a callable grid reads."""

    compiled: Any
    tail: tuple
    named: dict[str, Any]


class TunedKernel:
    """An autotuned kernel, launched as `kernel[grid](*args, **meta)` like the autotuner it wraps. A callable grid is
    given the keyword parameters (the call's meta-parameters and the chosen configuration's), not the positional
    arguments."""

    def __init__(self, autotuner: Autotuner) -> None:
        self.autotuner = autotuner
        self.kernel = autotuner.fn
        params = inspect.signature(self.kernel.fn).parameters.values()
        self._names = tuple(p.name for p in params)
        self._defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
        self._chosen: dict[tuple, dict[str, Any]] = {}
        self._plans: dict[tuple, _Plan] = {}

    def __getitem__(self, grid):
        return lambda *args, **meta: self.run(grid, *args, **meta)

    def run(self, grid, *args: Any, **meta: Any) -> None:
        """Launch over `grid`: through the autotuner on a key's first call, through JITFunction.run with its choice
        on the second, then directly; while torch.compile traces, through the autotuner (see the module docstring)."""
        if torch.compiler.is_compiling():
            self.autotuner[grid](*args, **meta)
            return
        specialised, pointers = specialise(args)
        key = specialised, tuple(meta.items())
        if DIRECT and self._plans:  # none under the interpreter, which has no driver to ask for a device
            device = driver.active.get_current_device()
            plan = self._plans.get((device, key))
            if plan is not None:
                self._start(plan, grid, args, pointers, device)
                return
        chosen = self._chosen.get(key)
        if chosen is None:
            self.autotuner[grid](*args, **meta)
            config = getattr(self.autotuner, "best_config", None)
            # else the key keeps going through the autotuner
            if config is not None and config.pre_hook is None and len(self._chosen) < MAX_KEYS:
                self._chosen[key] = config.all_kwargs()
            return
        compiled = self.kernel.run(*args, grid=grid, warmup=False, **meta, **chosen)
        if DIRECT and _launchable(compiled):
            named = {**meta, **chosen}
            rest = self._names[len(args) :]
            tail = tuple(named[n] if n in named else self._defaults[n] for n in rest)
            plan = _Plan(compiled, tail, dict(zip(rest, tail, strict=True)))
            self._plans[driver.active.get_current_device(), key] = plan

    @staticmethod
    def _start(plan: _Plan, grid, args: tuple, pointers: list, device: int) -> None:
        """Start the plan's compiled kernel as JITFunction.run would: every parameter in order, the grid of three, the
        device's current stream, Triton's launch hooks with the launch metadata (see `_hooks`). The tensors go as
        their data pointers (`specialise`), unless a hook is set: its launch metadata may read them."""
        compiled = plan.compiled
        if callable(grid):
            grid = grid(plan.named)
        size = (*grid, 1, 1)
        stream = driver.active.get_current_stream(device)
        enter, leave = _hooks()
        if enter is leave is None:
            metadata, bound = None, (*pointers, *plan.tail)
        else:
            bound = args + plan.tail
            metadata = compiled.launch_metadata(grid, stream, *bound)
        compiled.run(
            size[0], size[1], size[2], stream, compiled.function, compiled.packed_metadata, metadata, enter, leave,
            *bound,
        )  # fmt: skip


def _has_hooks(chain: Any) -> bool:
    """Whether a launch hook would run: not None and, for Triton's HookChain, holding a hook."""
    return chain is not None and bool(getattr(chain, "calls", True))


def _hooks() -> tuple[Any, Any]:
    """Triton's launch enter and exit hooks as this module passes them to the launcher, which calls a hook unless it
    is None: both as they are while either holds a hook (profilers such as proton add one), else None for both, so
    that no launch builds metadata for empty chains or calls them (Triton's own launch does both for every launch)."""
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    return (enter, leave) if _has_hooks(enter) or _has_hooks(leave) else (None, None)
