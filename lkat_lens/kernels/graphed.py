"""Eager calls of a kernel function replayed as CUDA graphs: captured at a key's second call, moving inputs copied in.

An eager LKAT step is bound by the host. The GLA core's forward issues some forty host ops and five Triton launches a
layer and its backward some sixty and four: 538 and 806 us a layer on a slow H200 host, a quarter of LKAT-T's step
(benchmarks/README.md, "An eager step's host time from inside our ops"). Replayed as a CUDA graph, the same kernels
cost one graph launch, a copy of each input that moves from call to call and a clone of each output the caller keeps.

`GraphedCalls` holds one module's captures of one function, keyed by what decides its kernels (`call_key`): each
tensor's shape, strides, dtype and device, the data pointer of each tensor that stays in place from call to call
(weights, tables, a forward capture's saved outputs; all but the `moving` positions), the values of the other
arguments and whether inference mode is on. A key's first call runs the function as it is (it autotunes and compiles
the kernels, and a shape an analysis runs once is never captured); its second captures it and replays the capture
from then on. A capture holds its own copies of the moving inputs and writes its outputs into the same memory on
every replay, so a caller clones what outlives the next replay, and a capture whose outputs are still to be read
(`Capture.claim`) is not replayed. Captures hold the tensors they read: a module keeps at most `max_keys` of them.

Calls whose outputs are read at once (`read_at_once`: a backward's gradients, an inference forward's output) share
the device's graph memory pool and one copy of each moving input per layout: any capture's replay may then overwrite
another's outputs and temporaries, which nothing reads by then. Their captures keep the first `keep` outputs and
give the rest's memory back to the pool. Without it (a training forward, whose saved outputs wait for the backward)
each capture has its own pool and copies.
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


_SHARED_POOLS: dict[torch.device, Any] = {}  # read-at-once captures' graph memory pool, per device
# read-at-once captures' copies of their moving inputs, per layout, each alive while a capture holds it
_SHARED_INPUTS: weakref.WeakValueDictionary[tuple, Tensor] = weakref.WeakValueDictionary()


def _shared_pool(device: torch.device) -> Any:
    """The graph memory pool the read-at-once captures on `device` share."""
    if device not in _SHARED_POOLS:
        with torch.cuda.device(device):
            _SHARED_POOLS[device] = torch.cuda.graph_pool_handle()
    return _SHARED_POOLS[device]


def _shared_input(arg: Tensor) -> Tensor:
    """The read-at-once captures' copy of a moving input of arg's layout, holding arg's values (one under inference
    mode, one outside: an inference tensor takes no in-place copy outside it); freed with the last capture holding
    it (a module's evicted captures, a deleted model)."""
    layout = (arg.shape, arg.stride(), arg.dtype, arg.device, torch.is_inference_mode_enabled())
    shared = _SHARED_INPUTS.get(layout)
    if shared is None:
        shared = torch.empty_strided(arg.shape, arg.stride(), dtype=arg.dtype, device=arg.device)
        _SHARED_INPUTS[layout] = shared
    return shared.copy_(arg)


class Capture:
    """fn(*args) as one CUDA graph: the inputs it reads (copies of the moving ones, the others as given) and the
    outputs each replay writes (the first `keep` of them, or all). `generation` counts the claimed replays, `replays`
    all of them."""

    def __init__(
        self, fn: Callable[..., Any], args: Sequence[Any], moving: frozenset[int], read_at_once: bool, keep: int | None
    ) -> None:
        self.moving = moving
        copy_of = _shared_input if read_at_once else Tensor.clone
        self.inputs = tuple(copy_of(arg) if i in moving else arg for i, arg in enumerate(args))
        pool = _shared_pool(args[min(moving)].device) if read_at_once else None
        self.graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(*self.inputs)  # once on the capture's stream first, as torch's CUDA-graph notes ask
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(self.graph, pool=pool, stream=side, capture_error_mode="thread_local"):
            self.outputs = fn(*self.inputs)[:keep]
        self.generation = self.replays = 0
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
        self.replays += 1
        return self.outputs


class GraphedCalls:
    """One module's captures of `fn` (its inputs at the `moving` positions move from call to call), by call_key;
    read_at_once and keep as the module docstring says. Copied or pickled with its module, it starts empty."""

    def __init__(
        self,
        fn: Callable[..., Any],
        moving: Sequence[int],
        *,
        read_at_once: bool,
        keep: int | None = None,
        max_keys: int = 4,
    ) -> None:
        self.fn, self.moving, self.read_at_once, self.keep, self.max_keys = (
            fn,
            frozenset(moving),
            read_at_once,
            keep,
            max_keys,
        )
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
            capture = self.captures[key] = Capture(self.fn, args, self.moving, self.read_at_once, self.keep)
        return capture

    def __call__(self, *args: Any) -> Any:
        """fn(*args) (its outputs up to `keep`), replayed once captured, the tensors cloned."""
        capture = self.capture_for(args)
        if capture is None:
            return self.fn(*args)[: self.keep]
        return tuple(t.clone() if isinstance(t, Tensor) else t for t in capture.replay(args))

    def __deepcopy__(self, memo: dict) -> GraphedCalls:
        return _fresh(*self._settings())

    def __reduce__(self) -> tuple:
        return _fresh, self._settings()

    def _settings(self) -> tuple:
        return self.fn, sorted(self.moving), self.read_at_once, self.keep, self.max_keys


def _fresh(
    fn: Callable[..., Any], moving: list[int], read_at_once: bool, keep: int | None, max_keys: int
) -> GraphedCalls:
    """GraphedCalls with these settings and no captures (what a copied or unpickled module gets)."""
    return GraphedCalls(fn, moving, read_at_once=read_at_once, keep=keep, max_keys=max_keys)
