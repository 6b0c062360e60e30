"""Eager calls of a kernel function replayed as CUDA graphs: captured at a key's second call, moving inputs copied in.

An eager LKAT step is bound by the host. The GLA core's forward issues some forty host ops and five Triton launches a
layer and its backward some sixty and four: 538 and 806 us a layer on a slow H200 host, a quarter of LKAT-T's step
(benchmarks/README.md, "An eager step's host time from inside our ops"). Replayed as a CUDA graph, the same kernels
cost one graph launch, a copy of each input that moves from call to call and a clone of each output the caller keeps.

`GraphedCalls` holds one module's captures of one function, keyed by what decides its kernels (`call_key`): each
tensor's shape, strides, dtype and device, the data pointer of each tensor that stays in place from call to call
(weights, tables, a forward capture's saved outputs; all but the `moving` positions), the values of the other
arguments and whether inference mode is on. A key's first call runs the function as it is (it autotunes and compiles the kernels, and a shape an
analysis runs once is never captured); its second captures it and replays the capture from then on. A capture holds
its own copies of the moving inputs and writes its outputs into the same memory on every replay, so a caller clones
what outlives the next replay, and a capture whose outputs are still to be read (`Capture.claim`) is not replayed.
Captures hold the tensors they read: a module keeps at most `max_keys` of them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor


def call_key(args: Sequence[Any], moving: frozenset[int]) -> tuple:
    """What decides a call's capture: per tensor its shape, strides, dtype, device and, unless its position is moving,
    its data pointer; a list as a tuple; anything else as it is."""
    parts = []
    for i, arg in enumerate(args):
        if isinstance(arg, Tensor):
            parts.append((arg.shape, arg.stride(), arg.dtype, arg.device, None if i in moving else arg.data_ptr()))
        else:
            parts.append(tuple(arg) if isinstance(arg, list) else arg)
    return tuple(parts)


class _Claim:
    """A replay's outputs still to be read: alive while whoever reads them (an autograd node) holds it."""

    __slots__ = ("__weakref__",)


class Capture:
    """fn(*args) as one CUDA graph: the inputs it reads (its own copies of the moving ones, the others as given) and
    the outputs each replay writes. `generation` counts the claimed replays."""

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any], moving: frozenset[int], pool: Any) -> None:
        self.moving = moving
        self.inputs = tuple(arg.clone() if i in moving else arg for i, arg in enumerate(args))
        self.graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(*self.inputs)  # once on the capture's stream first, as torch's CUDA-graph notes ask
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(self.graph, pool=pool, stream=side, capture_error_mode="thread_local"):
            self.outputs = fn(*self.inputs)
        self.generation = 0
        self._claim: weakref.ref | None = None

    def claim(self) -> _Claim | None:
        """A claim on the next replay's outputs, or None while an earlier claim is alive (its outputs unread)."""
        if self._claim is not None and self._claim() is not None:
            return None
        claim = _Claim()
        self._claim, self.generation = weakref.ref(claim), self.generation + 1
        return claim

    def replay(self, args: Sequence[Any]) -> Any:
        """The outputs for these arguments (the capture's own tensors): the moving inputs copied in, the graph
        replayed on the current stream."""
        for i in self.moving:
            self.inputs[i].copy_(args[i])
        self.graph.replay()
        return self.outputs


class GraphedCalls:
    """One module's captures of `fn`, by call_key; `pool` a graph memory pool the captures share (None: each its
    own). Copied or pickled with its module, it starts empty."""

    def __init__(self, fn: Callable[..., Any], moving: Sequence[int], pool: Any = None, max_keys: int = 4) -> None:
        self.fn, self.moving, self.pool, self.max_keys = fn, frozenset(moving), pool, max_keys
        self.seen: set[tuple] = set()
        self.captures: dict[tuple, Capture] = {}

    def capture_for(self, args: Sequence[Any]) -> Capture | None:
        """The capture for these arguments, made now on their key's second call; None on its first. Inference mode is
        part of the key: tensors a capture made under it could not be saved for a backward."""
        key = (torch.is_inference_mode_enabled(), *call_key(args, self.moving))
        capture = self.captures.get(key)
        if capture is None:
            if key not in self.seen:
                if len(self.seen) >= 16 * self.max_keys:
                    self.seen.clear()
                self.seen.add(key)
                return None
            if len(self.captures) >= self.max_keys:
                self.captures.clear()
            capture = self.captures[key] = Capture(self.fn, args, self.moving, self.pool)
        return capture

    def __call__(self, *args: Any) -> Any:
        """fn(*args), replayed once captured, its tensor outputs cloned (for outputs read at once)."""
        capture = self.capture_for(args)
        if capture is None:
            return self.fn(*args)
        return tuple(t.clone() if isinstance(t, Tensor) else t for t in capture.replay(args))

    def __deepcopy__(self, memo: dict) -> GraphedCalls:
        return GraphedCalls(self.fn, sorted(self.moving), self.pool, self.max_keys)

    def __reduce__(self) -> tuple:
        return GraphedCalls, (self.fn, sorted(self.moving), None, self.max_keys)
