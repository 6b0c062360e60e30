"""Measurements of our Triton kernels under the Triton interpreter, for the CPU tests of every kernel file.

TRITON_INTERPRET=1 only works if it is set before triton is first imported. A test file therefore measures
its cases in this process when the interpreter is already on, and otherwise runs itself as a script in a child
process with the variable set; the script prints its measurements as one `RESULTS <json>` line (see `report`).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable

import torch
from tolerance import rel_max
from torch import nn

import lkat_lens

PREFIX = "RESULTS "


def measurements(test_file: str, interpreting: bool, measure: Callable[[], dict]) -> dict:
    """measure() here when the interpreter is on, else the dict the child `python test_file` reports."""
    if interpreting:
        speed_up_the_interpreter()
        return measure()
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, test_file], env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(PREFIX)]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1].removeprefix(PREFIX))


def report(measure: Callable[[], dict]) -> None:
    """The child's side: print measure()'s dict as the RESULTS line."""
    speed_up_the_interpreter()
    print(PREFIX + json.dumps(measure()))


def speed_up_the_interpreter() -> None:
    """Patches of Triton's interpreter that compute the same values faster (each checked: identical RESULTS)."""
    patch_device_functions_once_per_launch()
    vectorise_generic_scans()
    cache_numpy_dtypes()
    skip_discarded_overflow_checks()


def skip_discarded_overflow_checks() -> None:
    """Turn off the interpreter's integer-overflow sanitizer, whose checks it computes and then discards. With
    `sanitize_overflow` on (the interpreter's default, 3.x), every int32 add, sub and mul of a kernel is done again in
    int64 and compared with the int32 bounds, but the result goes to device_assert, which returns without checking
    unless `debug` is on (it is off, as in a compiled kernel without debug). That was about two fifths of
    tests/test_gla_short.py's child under cProfile. Without it the kernels' values are the same."""
    import dataclasses

    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    options = getattr(builder, "options", None)
    if dataclasses.is_dataclass(options) and not options.debug and getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


def cache_numpy_dtypes() -> None:
    """Remember the numpy dtype the interpreter stores each Triton dtype as. Its lookup (3.x) builds a dict of twenty
    numpy dtypes at every call, a million calls in tests/test_gla_short.py's child (a seventh of its time under
    cProfile); the answer depends on the dtype alone, a block's on its element dtype (dtypes hash and compare by
    name; block and pointer types do not hash)."""
    import triton.language as tl
    from triton.runtime import interpreter

    find = interpreter._get_np_dtype
    if getattr(find, "cached", False):
        return
    found: dict = {}

    def cached(tt_dtype):
        key = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(key, tl.pointer_type):  # the lookup's first case, before it builds the dict
            return find(key)
        if key not in found:
            found[key] = find(key)
        return found[key]

    cached.cached = True
    interpreter._get_np_dtype = cached


def vectorise_generic_scans() -> None:
    """Run tl.associative_scan with a combine function other than a sum or product one step of the scanned axis at a
    time over all other positions at once, instead of one element at a time. The interpreter (3.x) calls the combine
    function per element in Python; kernels/chunk_states.py's scan over chunk blocks made this about a quarter of
    tests/test_gla_short.py's child. Each element still takes the same left-to-right sequence of combine steps, and a
    combine function acts elementwise, so the values are the same (chunk_states' is multiplies and adds only)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    scan = interpreter.ScanOps
    if getattr(scan.generic_scan, "vectorised", False) or not hasattr(scan, "to_tensor"):
        return

    def generic_scan(self, inputs):
        data = [np.moveaxis(arg.handle.data, self.axis, 0) for arg in inputs]
        out = [np.empty_like(d) for d in data]
        acc = None
        for i in range(data[0].shape[0]):
            step = tuple(self.to_tensor(d[i], arg.dtype) for d, arg in zip(data, inputs, strict=True))
            if acc is None:
                acc = step
            else:
                ret = self.combine_fn.fn(*acc, *step)
                acc = ret if isinstance(ret, tuple) else (ret,)
            for o, a in zip(out, acc, strict=True):
                o[i] = a.handle.data.reshape(o[i].shape) if isinstance(a, tl.core.tensor) else a
        return [self.to_tensor(np.moveaxis(o, 0, self.axis), arg.dtype) for o, arg in zip(out, inputs, strict=True)]

    generic_scan.vectorised = True
    scan.generic_scan = generic_scan


def patch_device_functions_once_per_launch() -> None:
    """Let the interpreter patch triton.language for each @triton.jit device function once per kernel launch, not at
    every call. Triton's interpreter (3.x) re-patches the language modules a device function sees (an
    inspect.getmembers over each) at every call of it, in every program of the grid; our kernels call small helpers in
    their loops, so this was ~40 % of a child's time (tests/test_gla_short.py alone: 95 -> 54 s). After a function's
    first call in a launch its modules stay patched until the launch ends (by the launch, or by that first call, whose
    patches the interpreter never undoes), so skipping the later calls' patching computes the same values. Where
    this interpreter has other internals, nothing is changed."""
    from triton.runtime import interpreter

    launch, device_call = interpreter.GridExecutor.__call__, interpreter.InterpretedFunction.__call__
    if getattr(launch, "counts_device_functions", False) or not hasattr(interpreter.InterpretedFunction, "rewrite"):
        return
    called: set | None = None  # the device functions called so far in the launch running now

    def counted_launch(self, *args, **kwargs):
        nonlocal called
        outer, called = called, set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            called = outer

    def call_device_function(self, *args, **kwargs):
        if called is None or self.fn not in called:
            if called is not None:
                called.add(self.fn)
            return device_call(self, *args, **kwargs)
        try:
            return self.rewrite()(*args, **kwargs)
        except Exception as e:  # as the interpreter's own call reports it
            raise interpreter.InterpreterError(repr(e)) from e

    counted_launch.counts_device_functions = True
    interpreter.GridExecutor.__call__ = counted_launch
    interpreter.InterpretedFunction.__call__ = call_device_function


def logits_and_grads(model: torch.nn.Module, images: torch.Tensor, **backends: str) -> list[torch.Tensor]:
    """Logits and every parameter gradient of one backward of the logits' squares, with set_backends(**backends)."""
    model.set_backends(**backends)
    model.zero_grad()
    logits = model(images)
    logits.square().sum().backward()
    return [logits.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]


def path_errors(model: torch.nn.Module, images: torch.Tensor, backend: str) -> tuple[dict[str, float], int]:
    """({mode: largest relative error of the logits and parameter gradients}, gradients compared) of `model` with its
    `backend` path (a set_backends keyword) in modes "torch" and "fused", each against a float64 copy in "torch"."""
    exact = logits_and_grads(copy.deepcopy(model).double(), images.double(), **{backend: "torch"})
    errors = {}
    for mode in ("torch", "fused"):
        results = logits_and_grads(model, images, **{backend: mode})
        errors[mode] = max(rel_max(a, b) for a, b in zip(results, exact, strict=True))
    return errors, len(exact) - 1


def path_in_lkat(path: str, fuses: Callable[[nn.Module], bool], hooked: Callable[[nn.Module], nn.Module]) -> dict:
    """lkat_micro in fp32 with its `path` (a set_backends keyword: gla_input, gla_output, gla_gate) fused and as
    modules, each against the model in fp64 (path_errors); then, for block 0's attention, whether fuses(attn) holds in
    mode "fused", in "auto" (the CPU's modules) and in "fused" with a forward hook on hooked(attn), and how many times
    that hook fired in one forward of the model."""
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_micro", num_classes=10).set_backends(attn="torch")
    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    errors, grads = path_errors(model, images, path)
    attn = model.blocks[0].attn
    measured = {"grads": grads, "errors": errors, "fuses": fuses(attn)}  # path_errors ends in mode "fused"
    measured["fuses_auto_cpu"] = fuses(model.set_backends(**{path: "auto"}).blocks[0].attn)
    model.set_backends(**{path: "fused"})
    calls = []
    handle = hooked(attn).register_forward_hook(lambda *_: calls.append(1))
    measured["fuses_hooked"] = fuses(attn)
    model(images)
    handle.remove()
    return measured | {"hook_calls": len(calls)}
