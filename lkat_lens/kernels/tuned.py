"""Autotuned Triton kernels launched with the configuration Triton's autotuner chose, without its per-call work.

triton.autotune chooses a configuration on a key's first call (or reads it from Triton's autotuning cache) and then,
on every later call, rebuilds a dict of the arguments, its key and the configuration's keyword arguments before it
launches. In an eager LKAT step, which is bound by the host, cProfile put that at about 25 µs (profiled time) of each
of ~170 launches (H200 machine). A TunedKernel wraps an autotuner: the first call of each key goes through it, later
calls launch the kernel with the configuration it chose. The key is the autotuner's own (the values of its key
arguments and the dtypes of the tensor arguments), read by position.
"""

from __future__ import annotations

from typing import Any

import torch
from triton.runtime.autotuner import Autotuner


class TunedKernel:
    """An autotuned kernel, launched as `kernel[grid](*args, **meta)` like the autotuner it wraps."""

    def __init__(self, autotuner: Autotuner) -> None:
        self.autotuner = autotuner
        self.kernel = autotuner.fn
        names = list(autotuner.arg_names)
        self._key_args = [(name, names.index(name)) for name in autotuner.keys]
        self._chosen: dict[tuple, dict[str, Any]] = {}

    def key(self, args: tuple, meta: dict) -> tuple:
        """The autotuner's key of a call: its key arguments' values, then the dtypes of the tensor arguments."""
        values = [args[i] if i < len(args) else meta[name] for name, i in self._key_args]
        return (*values, *(a.dtype for a in args if isinstance(a, torch.Tensor)))

    def __getitem__(self, grid):
        return lambda *args, **meta: self.run(grid, *args, **meta)

    def run(self, grid, *args: Any, **meta: Any) -> None:
        """Launch over `grid`: through the autotuner on a key's first call, with its choice afterwards."""
        key = self.key(args, meta)
        chosen = self._chosen.get(key)
        if chosen is not None:
            self.kernel.run(*args, grid=grid, warmup=False, **meta, **chosen)
            return
        self.autotuner[grid](*args, **meta)
        config = getattr(self.autotuner, "best_config", None)
        if config is not None and config.pre_hook is None:  # else the key keeps going through the autotuner
            self._chosen[key] = config.all_kwargs()
