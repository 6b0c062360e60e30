"""Choose the fastest correct path of a KAN layer per layer shape: checked and measured once, cached per process.

Correctness is checked against the "torch" path on CHECK_ROWS rows only, so the check never materialises the
full-size basis the torch path builds (gigabytes for a large training batch): x's first rows, or, given a span, rows
drawn over it (a KAN layer passes its grid's). A kernel's correctness does not depend on the data, and the batch's
rows can say nothing about it: the inputs of LKAT's fc2 are all 0 at initialisation (one point of the grid, where the
derivative's sum cancels), and inputs beyond the grid give outputs and gradients that vanish for every path. Only
paths that pass are timed, at full size; the torch path is the fallback, never a timed candidate.

On CUDA a path is timed by the device's time of its kernels, not by the wall clock: the calls are queued behind a
device-side wait long enough for the host to queue them all, so the kernels run back to back and the host's pace
does not count. One layer at LKAT-T's size is bound by the host (about 1 ms of Python and launches a call against
0.1-0.5 ms of kernels, H100), and wall-clock rounds swapped the paths' order from run to run; in a model's step the
host's and the device's work overlap, and the kernels are what a GPU-bound step waits for.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence

import torch

# A path is taken only if its output and input gradient are this close to the torch path's (relative norm).
_TOL = {torch.float32: 1e-3, torch.bfloat16: 3e-2, torch.float16: 3e-2}
_REPEATS, _ROUNDS = 5, 5  # calls per timed round, rounds per path
_HOLD_CYCLES = 2**24  # the device-side wait before a timed round (~10 ms), quadrupled until the host keeps up
CHECK_ROWS = 4096
_CHOICES: dict[tuple, str] = {}

Run = Callable[..., torch.Tensor]


def cached_choices() -> dict[tuple, str]:
    """The paths chosen so far, by key (a copy)."""
    return dict(_CHOICES)


def clear_choices() -> None:
    """Forget every choice (the next call of each shape measures again)."""
    _CHOICES.clear()


def choose_path(
    key: tuple,
    paths: Sequence[str],
    run: Run,
    inputs: Sequence[torch.Tensor],
    default: str,
    span: tuple[float, float] | None = None,
) -> str:
    """The cached path for key, else the fastest of `paths` whose results match the "torch" path.

    run(path, x, *params) computes the layer; inputs = (x, *params) with x [..., in]. The measurement is a
    forward (and a backward, when grad mode is on and an input requires grad) on detached copies; with `span`
    (lo, hi), the check's x is drawn uniformly over it (seeded) instead of being x's first rows. While torch.compile
    traces or a CUDA graph is captured nothing is measured and an unmeasured key gets default.
    """
    if key in _CHOICES:
        return _CHOICES[key]
    if torch.compiler.is_compiling() or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
        return default
    _CHOICES[key] = _fastest_correct(key, [p for p in paths if p != "torch"], run, inputs, span)
    return _CHOICES[key]


def _copies(
    inputs: Sequence[torch.Tensor], train: bool, rows: int | None = None, span: tuple[float, float] | None = None
) -> list[torch.Tensor]:
    """Detached copies of (x, *params), x cut to its first `rows` rows (with span: as many rows drawn uniformly over
    it, seeded), requiring grad as the originals do."""
    x, *params = inputs
    if rows is not None:
        x = x.reshape(-1, x.shape[-1])[:rows]
    copies = [t.detach().clone().requires_grad_(t.requires_grad and train) for t in (x, *params)]
    if span is not None:
        generator = torch.Generator(device=x.device).manual_seed(0)
        with torch.no_grad():
            copies[0].uniform_(*span, generator=generator)
    return copies


def _fastest_correct(
    key: tuple,
    candidates: Sequence[str],
    run: Run,
    inputs: Sequence[torch.Tensor],
    span: tuple[float, float] | None,
) -> str:
    """Check every candidate (output and all gradients) against torch on CHECK_ROWS rows; time those that pass at
    full size (in alternating rounds, each path's fastest round); torch if none passes."""
    train = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
    head = _copies(inputs, train, CHECK_ROWS, span)
    reference = _step(run, "torch", head, None)
    dy = torch.randn_like(reference[0]) if train else None
    reference = _step(run, "torch", head, dy)
    passing = []
    for path in candidates:
        try:
            results = _step(run, path, head, dy)
        except Exception as err:  # a kernel that does not build or launch on this device is skipped, not fatal
            warnings.warn(f"KAN path {path!r} failed for {key} and is not used: {err}", RuntimeWarning, stacklevel=4)
            continue
        same = len(results) == len(reference)  # a path that leaves a gradient out is wrong
        errors = [_rel_error(out, ref) for out, ref in zip(results, reference, strict=False)] if same else []
        if not errors or max(errors) > _TOL.get(reference[0].dtype, 1e-3):
            warnings.warn(f"KAN path {path!r} differs from torch for {key} ({errors}); not used", stacklevel=4)
            continue
        passing.append(path)
    if len(passing) < 2:
        return passing[0] if passing else "torch"
    full = _copies(inputs, train)
    y = _step(run, passing[0], full, None)[0]
    dy_full = torch.randn_like(y) if train else None
    for path in passing:
        _step(run, path, full, dy_full)  # compiles and autotunes for the full shape outside the timing
    times = dict.fromkeys(passing, math.inf)
    for _ in range(_ROUNDS):  # the paths in turn, each path's fastest round: a one-off stall decides nothing
        for path in passing:
            times[path] = min(times[path], _time(run, path, full, dy_full))
    return min(times, key=times.get)


def _step(run: Run, path: str, probes: list[torch.Tensor], dy: torch.Tensor | None) -> list[torch.Tensor]:
    """Output, and with dy the gradients of every input that requires grad, of one call."""
    for t in probes:
        t.grad = None
    y = run(path, *probes)
    if dy is None:
        return [y.detach()]
    y.backward(dy)
    return [y.detach()] + [t.grad for t in probes if t.requires_grad and t.grad is not None]


def _calls(run: Run, path: str, probes: list[torch.Tensor], dy: torch.Tensor | None) -> None:
    """_REPEATS calls of the path (forward, and backward with dy)."""
    for _ in range(_REPEATS):
        for t in probes:
            t.grad = None
        y = run(path, *probes)
        if dy is not None:
            y.backward(dy)


def _time(run: Run, path: str, probes: list[torch.Tensor], dy: torch.Tensor | None) -> float:
    """Seconds of one call: on CUDA the device's (device_seconds), else the wall clock's, over _REPEATS calls."""
    if probes[0].is_cuda:
        return device_seconds(lambda: _calls(run, path, probes, dy), probes[0].device) / _REPEATS
    start = time.perf_counter()
    _calls(run, path, probes, dy)
    return (time.perf_counter() - start) / _REPEATS


def device_seconds(work: Callable[[], None], device: torch.device) -> float:
    """Seconds the device spends on what work() queues on the current stream, whatever the host's pace: the work is
    queued behind a device-side wait (torch.cuda._sleep), between two timing events. If the wait ended before the
    host had queued it all (the first event already done), the device may have idled between kernels: the wait is
    made four times longer and the work timed again (at most four times; then the last timing counts)."""
    cycles = _HOLD_CYCLES
    with torch.cuda.device(device):
        torch.cuda.synchronize()
        for _ in range(4):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(cycles)
            start.record()
            work()
            end.record()
            queued_ahead = not start.query()  # the device was still waiting when the host had queued everything
            end.synchronize()
            if queued_ahead:
                break
            cycles *= 4
    return start.elapsed_time(end) / 1e3


def _rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp32 (0 when both vanish)."""
    diff = (out.float() - ref.float()).norm().item()
    return diff / max(ref.float().norm().item(), 1e-30) if diff else 0.0
