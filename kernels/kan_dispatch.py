"""Choose the fastest correct path of a KAN layer per layer shape on CUDA: measured once, cached per process."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch

# A path is taken only if its output and input gradient are this close to the torch path's (relative norm).
_TOL = {torch.float32: 1e-3, torch.bfloat16: 3e-2, torch.float16: 3e-2}
_REPEATS = 5
_CHOICES: dict[tuple, str] = {}

Run = Callable[..., torch.Tensor]


def cached_choices() -> dict[tuple, str]:
    """The paths chosen so far, by key (a copy)."""
    return dict(_CHOICES)


def clear_choices() -> None:
    """Forget every choice (the next call of each shape measures again)."""
    _CHOICES.clear()


def choose_path(key: tuple, paths: Sequence[str], run: Run, inputs: Sequence[torch.Tensor], default: str) -> str:
    """The cached path for key, else the fastest of paths whose results match the "torch" path on these inputs.

    run(path, *inputs) computes the layer. The measurement is a forward (and a backward into the inputs
    that require grad, when grad mode is on) on copies of the inputs; while torch.compile traces or a
    CUDA graph is captured nothing is measured and an unmeasured key gets default.
    """
    if key in _CHOICES:
        return _CHOICES[key]
    if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
        return default
    _CHOICES[key] = _fastest_correct(key, paths, run, inputs)
    return _CHOICES[key]


def _fastest_correct(key: tuple, paths: Sequence[str], run: Run, inputs: Sequence[torch.Tensor]) -> str:
    """Time every path that runs and matches the torch path; the torch path is always a candidate."""
    train = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
    probes = [t.detach().clone().requires_grad_(t.requires_grad and train) for t in inputs]
    reference = _step(run, "torch", probes, None)
    dy = torch.randn_like(reference[0]) if train else None
    reference = _step(run, "torch", probes, dy)
    times = {"torch": _time(run, "torch", probes, dy)}
    for path in paths:
        if path == "torch":
            continue
        try:
            results = _step(run, path, probes, dy)  # also compiles and autotunes
        except Exception as err:  # a kernel that does not build or launch on this device is skipped, not fatal
            warnings.warn(f"KAN path {path!r} failed for {key} and is not used: {err}", RuntimeWarning, stacklevel=3)
            continue
        errors = [_rel_error(out, ref) for out, ref in zip(results, reference, strict=True)]
        if max(errors) > _TOL.get(reference[0].dtype, 1e-3):
            warnings.warn(f"KAN path {path!r} differs from torch for {key} ({errors}); not used", stacklevel=3)
            continue
        times[path] = _time(run, path, probes, dy)
    return min(times, key=times.get)


def _step(run: Run, path: str, probes: list[torch.Tensor], dy: torch.Tensor | None) -> list[torch.Tensor]:
    """Output, and with dy the gradient of the first input (x), of one call."""
    probes[0].grad = None
    y = run(path, *probes)
    if dy is None:
        return [y.detach()]
    y.backward(dy)
    return [y.detach()] + ([probes[0].grad] if probes[0].grad is not None else [])


def _time(run: Run, path: str, probes: list[torch.Tensor], dy: torch.Tensor | None) -> float:
    """Mean milliseconds of one call (forward, and backward with dy) over a few repeats."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(_REPEATS):
        for t in probes:
            t.grad = None
        y = run(path, *probes)
        if dy is not None:
            y.backward(dy)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / _REPEATS


def _rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp32 (0 when both vanish)."""
    diff = (out.float() - ref.float()).norm().item()
    return diff / max(ref.float().norm().item(), 1e-30) if diff else 0.0
