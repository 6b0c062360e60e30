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
from typing import Any

import torch
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
    (i32, i64, u64); the type of a float or bool; the value of a constexpr argument or of anything else."""
    key = []
    for arg, is_constexpr in zip(args, constexpr, strict=False):
        if is_constexpr:
            key.append(("constexpr", arg))
        elif isinstance(arg, torch.Tensor):
            key.append((arg.dtype, arg.data_ptr() % 16 == 0, arg.get_device()))
        elif isinstance(arg, (bool, float)):
            key.append(type(arg))
        elif isinstance(arg, int):
            width = 32 if -_I32 <= arg < _I32 else (64 if -_I64 <= arg < _I64 else 65)
            key.append((arg == 1, arg % 16 == 0, width))
        else:
            key.append(arg)
    return tuple(key)


def _launchable(compiled: Any) -> bool:
    """Whether JITFunction.run returned a compiled kernel this module can start (not None, not a future)."""
    return all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata", "launch_metadata"))


class TunedKernel:
    """An autotuned kernel, launched as `kernel[grid](*args, **meta)` like the autotuner it wraps."""

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
        self._compiled: dict[tuple, Any] = {}

    def key(self, args: tuple, meta: dict) -> tuple:
        """A call's key: its autotuning key values, keyword arguments and argument specialisation."""
        values = tuple(args[i] if i < len(args) else meta[name] for name, i in self._key_args)
        return values, tuple(meta.items()), specialisation(args, self._constexpr)

    def __getitem__(self, grid):
        return lambda *args, **meta: self.run(grid, *args, **meta)

    def run(self, grid, *args: Any, **meta: Any) -> None:
        """Launch over `grid`: through the autotuner on a key's first call, through JITFunction.run with its choice
        on the second, then directly."""
        key = self.key(args, meta)
        chosen = self._chosen.get(key)
        if chosen is None:
            self.autotuner[grid](*args, **meta)
            config = getattr(self.autotuner, "best_config", None)
            if config is not None and config.pre_hook is None:  # else the key keeps going through the autotuner
                self._chosen[key] = config.all_kwargs()
            return
        compiled = self._compiled.get(key) if DIRECT else None
        if compiled is None:
            compiled = self.kernel.run(*args, grid=grid, warmup=False, **meta, **chosen)
            if _launchable(compiled):
                self._compiled[key] = compiled
            return
        self._start(compiled, grid, args, {**meta, **chosen})

    def _start(self, compiled: Any, grid, args: tuple, meta: dict) -> None:
        """Start `compiled` as JITFunction.run would: every parameter in order (the keyword ones from meta or their
        defaults), the grid of three, the current stream, the launch hooks."""
        bound = (*args, *(meta[n] if n in meta else self._defaults[n] for n in self._names[len(args) :]))
        if callable(grid):
            grid = grid(dict(zip(self._names, bound, strict=True)))
        size = (*grid, 1, 1)
        stream = driver.active.get_current_stream(driver.active.get_current_device())
        compiled.run(
            size[0], size[1], size[2], stream, compiled.function, compiled.packed_metadata,
            compiled.launch_metadata(grid, stream, *bound),
            knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *bound,
        )  # fmt: skip
