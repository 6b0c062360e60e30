"""Autotuned Triton kernels launched with the configuration Triton's autotuner chose, without Triton's per-call work.

triton.autotune chooses a configuration on a key's first call (or reads it from Triton's autotuning cache) and then,
on every later call, rebuilds a dict of the arguments, its key and the configuration's keyword arguments before it
launches; Triton's JITFunction.run then binds the arguments, specialises them, builds its cache key and checks the
kernel's globals. In an eager LKAT step, which is bound by the host, cProfile put the launches at about a quarter of
the step (~190 launches a step, H200 machine). A TunedKernel wraps an autotuner: a key's first call goes through it,
the next through JITFunction.run with the chosen configuration, which returns the compiled kernel; later calls start
that compiled kernel directly, as JITFunction.run does (the same arguments, grid, stream and launch hooks).

The key holds what decides the compiled kernel: the values of the autotuner's key arguments, the keyword arguments
and the arguments' specialisation (`specialisation`: as Triton computes it, or finer, with the tensors' device).
`DIRECT = False` sends every launch through JITFunction.run (benchmarks/bench_eager_host.py compares both).
"""

from __future__ import annotations

import inspect
import math
from typing import Any, NamedTuple

from torch import Tensor
from triton import knobs
from triton.runtime import driver
from triton.runtime.autotuner import Autotuner

from .host_math import next_power_of_2

DIRECT = True
_I32, _I64 = 2**31, 2**63


def programs_key(*counts: int) -> int:
    """An autotuning key argument for how much a launch has to do: the power of two at or above the product of
    `counts` (its programs, or its rows). Which configuration wins (warps, row tiles, a register cap) depends on how
    many programs share the SMs, and Triton's autotuning cache outlives the process: keyed on the shapes alone, a
    tuning made at a test's or an analysis's batch of 2 would serve a training batch of 128."""
    return next_power_of_2(math.prod(counts))


def specialisation(args: tuple, constexpr: tuple[bool, ...]) -> tuple:
    """What Triton's specialisation of these positional arguments depends on (as fine as it, or finer), and their
    device: a tensor's dtype, 16-byte alignment and device; an integer's being 1, its divisibility by 16 and its width
    (i32, i64, u64); the type of a float or bool; the value of a constexpr argument or of anything else (an int
    subclass, a string). It runs on every launch (~200 an eager LKAT-T training step): plain integers are told by
    their exact type first and their width is written inline, half the time of isinstance checks in order (6.8
    against 9.4-12.4 us for the GLA input kernel's key, 16 arguments, on the CPU machine)."""
    key = []
    append = key.append
    for arg, is_constexpr in zip(args, constexpr, strict=False):
        if is_constexpr:
            append(("constexpr", arg))
        elif type(arg) is int:
            append((arg == 1, not arg & 15, 32 if -_I32 <= arg < _I32 else (64 if -_I64 <= arg < _I64 else 65)))
        elif isinstance(arg, Tensor):
            append((arg.dtype, not arg.data_ptr() & 15, arg.get_device()))
        elif isinstance(arg, (bool, float)):
            append(type(arg))
        else:  # an int subclass too: keyed by its value, finer than Triton
            append(arg)
    return tuple(key)


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
        names = list(autotuner.arg_names)
        self._key_args = [(name, names.index(name)) for name in autotuner.keys]
        params = inspect.signature(self.kernel.fn).parameters.values()
        self._names = tuple(p.name for p in params)
        # Triton's own rule (KernelParam.is_constexpr); the interpreter's functions have no KernelParams
        self._constexpr = tuple("constexpr" in str(p.annotation) for p in params)
        self._defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
        self._chosen: dict[tuple, dict[str, Any]] = {}
        self._plans: dict[tuple, _Plan] = {}

    def key(self, args: tuple, meta: dict) -> tuple:
        """A call's key: its autotuning key values, keyword arguments and argument specialisation."""
        values = tuple([args[i] if i < len(args) else meta[name] for name, i in self._key_args])
        return values, tuple(meta.items()), specialisation(args, self._constexpr)

    def __getitem__(self, grid):
        return lambda *args, **meta: self.run(grid, *args, **meta)

    def run(self, grid, *args: Any, **meta: Any) -> None:
        """Launch over `grid`: through the autotuner on a key's first call, through JITFunction.run with its choice
        on the second, then directly."""
        key = self.key(args, meta)
        plan = self._plans.get(key) if DIRECT else None
        if plan is not None:
            self._start(plan, grid, args)
            return
        chosen = self._chosen.get(key)
        if chosen is None:
            self.autotuner[grid](*args, **meta)
            config = getattr(self.autotuner, "best_config", None)
            if config is not None and config.pre_hook is None:  # else the key keeps going through the autotuner
                self._chosen[key] = config.all_kwargs()
            return
        compiled = self.kernel.run(*args, grid=grid, warmup=False, **meta, **chosen)
        if DIRECT and _launchable(compiled):
            named = {**meta, **chosen}
            rest = self._names[len(args) :]
            tail = tuple(named[n] if n in named else self._defaults[n] for n in rest)
            self._plans[key] = _Plan(compiled, tail, dict(zip(rest, tail, strict=True)))

    @staticmethod
    def _start(plan: _Plan, grid, args: tuple) -> None:
        """Start the plan's compiled kernel as JITFunction.run would: every parameter in order, the grid of three, the
        current stream, Triton's launch hooks with the launch metadata (see `_hooks`)."""
        compiled, bound = plan.compiled, args + plan.tail
        if callable(grid):
            grid = grid(plan.named)
        size = (*grid, 1, 1)
        stream = driver.active.get_current_stream(driver.active.get_current_device())
        enter, leave = _hooks()
        metadata = None if enter is leave is None else compiled.launch_metadata(grid, stream, *bound)
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
