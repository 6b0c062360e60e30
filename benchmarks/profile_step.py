"""One step under torch.profiler: kernel launches, the GPU-busy fraction and where the device time goes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

STEP = "bench_step"
# Host calls that start device work (kernels, copies, memsets, CUDA graphs).
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaGraphLaunch")
COPY_OPS = ("aten::copy_", "aten::_to_copy")
TOP = 15
GAPS = 5  # the device's longest idle spans reported per step


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def idle_gaps(
    intervals: list[tuple[float, float]], start: float, end: float, top: int = GAPS
) -> list[tuple[float, float]]:
    """The `top` longest spans of [start, end) that no interval covers, longest first."""
    gaps, reach = [], start
    for a, b in sorted(intervals):
        if a > reach:
            gaps.append((reach, a))
        reach = max(reach, b)
    if end > reach:
        gaps.append((reach, end))
    return sorted(gaps, key=lambda g: g[1] - g[0], reverse=True)[:top]


def _host_phases(events, step) -> list:
    """The host events a step is made of: the step's direct children, and the outermost events of other threads
    (autograd's device threads) that start inside it."""
    inside = step.time_range
    return [
        e
        for e in events
        if e.device_type == DeviceType.CPU
        and e is not step
        and (e.cpu_parent is step or (e.cpu_parent is None and e.thread != step.thread))
        and inside.start <= e.time_range.start < inside.end
    ]


def _gap_report(kernels: list[tuple[float, float]], phases: list, start: float, end: float) -> list[dict]:
    """The device's longest idle spans in the step (ms from the step's start on the host), each with the host
    phases that ran during it."""
    rows = []
    for a, b in idle_gaps(kernels, start, end):
        during = [e.name for e in phases if e.time_range.start < b and e.time_range.end > a]
        rows.append({"at_ms": (a - start) / 1e3, "ms": (b - a) / 1e3, "host": list(dict.fromkeys(during))})
    return rows


def copy_callers(events, step, top: int = 10) -> dict[str, int]:
    """The step's host `aten::copy_` calls counted by where they were made: "outermost event > direct caller" (the
    outermost below the step, such as a compiled region, a backward node or the optimizer's step; the caller alone
    where it is the outermost), the `top` most frequent."""
    inside, counts = step.time_range, defaultdict(int)
    for e in events:
        if e.name != "aten::copy_" or e.device_type != DeviceType.CPU:
            continue
        if not inside.start <= e.time_range.start < inside.end:
            continue
        chain, parent = [], e.cpu_parent
        while parent is not None and parent is not step:
            chain.append(parent.name)
            parent = parent.cpu_parent
        where = [chain[-1], chain[0]] if len(chain) > 1 else chain or ["(the step itself)"]
        counts[" > ".join(where)] += 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:top])


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _top(times: dict[str, float], counts: dict[str, int], total: float, top: int) -> list[dict]:
    """The `top` largest entries of name -> microseconds, with calls and shares of total."""
    ranked = sorted(times, key=times.get, reverse=True)[:top]
    return [{"op": k, "calls": counts[k], "ms": times[k] / 1e3, "share": times[k] / total} for k in ranked]


def profile_step(step: Callable[[], object], device: str, top: int = TOP) -> dict:
    """Profile one call of step (already warmed up): launches, busy fraction, where the device time goes.

    Device time is the sum of the device events themselves (kernels, copies, memsets; user annotations such as
    inductor's "## Call CompiledFxGraph" ranges left out), so nothing is counted twice. device_kernels: device
    events; launch_calls: host launch calls; gpu_busy: the union of device events over the step's span (from its
    start on the host to the later of its end and the last device event); top_kernels: the `top` device events by name;
    top_ops: the host ops by the device time of the kernels they launched (self device time; on a CPU, self CPU
    time); copy_share: aten::copy_/_to_copy's device time over all; to_copy_calls: aten::_to_copy calls;
    first_kernel_ms: the host's time from the step's start to its first device event; idle_gaps: the device's
    longest idle spans with the host phases (the step's direct children, other threads' outermost events) during
    each; host_phases: those phases' host milliseconds by name; copy_callers: where its host `aten::copy_` calls
    were made (copy_callers).
    """
    cuda = device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync(device)
    with profile(activities=activities) as prof:
        with record_function(STEP):
            step()
        _sync(device)
    events = prof.events()
    step_event = next(e for e in events if e.name == STEP and e.device_type == DeviceType.CPU)
    span = step_event.time_range
    device_events = [
        e for e in events if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    ]
    kernels = [(e.time_range.start, e.time_range.end) for e in device_events]
    end = max([span.end, *(k[1] for k in kernels)])
    kernel_us, kernel_calls = defaultdict(float), defaultdict(int)
    for e in device_events:
        kernel_us[e.name] += e.time_range.elapsed_us()
        kernel_calls[e.name] += 1
    averages = prof.key_averages()
    self_time = (lambda a: a.self_device_time_total) if cuda else (lambda a: a.self_cpu_time_total)
    host_ops = [
        a for a in averages if a.key != STEP and self_time(a) > 0 and not getattr(a, "is_user_annotation", False)
    ]
    op_us = {a.key: self_time(a) for a in host_ops if a.key not in kernel_us}
    op_calls = {a.key: a.count for a in host_ops}
    total = (sum(kernel_us.values()) if cuda else sum(op_us.values())) or 1.0
    phases = _host_phases(events, step_event)
    phase_us = defaultdict(float)
    for e in phases:
        phase_us[e.name] += e.time_range.elapsed_us()
    return {
        "step_wall_ms": (end - span.start) / 1e3,
        "device_kernels": len(kernels) if cuda else None,
        "launch_calls": sum(a.count for a in averages if a.key in LAUNCHES) if cuda else None,
        "gpu_busy": _union_us(kernels) / (end - span.start) if cuda else None,
        "device_time_ms": total / 1e3,
        "copy_share": sum(op_us.get(k, 0.0) for k in COPY_OPS) / total,
        "to_copy_calls": op_calls.get("aten::_to_copy", 0),
        "top_kernels": _top(kernel_us, kernel_calls, total, top) if cuda else [],
        "top_ops": _top(op_us, op_calls, total, top),
        "first_kernel_ms": (min(k[0] for k in kernels) - span.start) / 1e3 if kernels else None,
        "idle_gaps": _gap_report(kernels, phases, span.start, end) if cuda else [],
        "host_phases": {name: us / 1e3 for name, us in sorted(phase_us.items(), key=lambda kv: -kv[1])},
        "copy_callers": copy_callers(events, step_event),
    }
