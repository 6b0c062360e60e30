"""One step under torch.profiler: kernel launches, the GPU-busy fraction and where the device time goes."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

STEP = "bench_step"
# Host calls that start device work (kernels, copies, memsets, CUDA graphs).
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaGraphLaunch")
COPY_OPS = ("aten::copy_", "aten::_to_copy")
TOP = 15


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def profile_step(step: Callable[[], object], device: str) -> dict:
    """Profile one call of step (already warmed up): launches, busy fraction, op shares of the device time.

    device_kernels: device-side events (kernels, copies, memsets); launch_calls: host launch calls; gpu_busy: the
    union of device events over the step's span (from its start on the host to the later of its end and the last
    device event); copy_share: aten::copy_/_to_copy's share of the self device time (self CPU time on a CPU);
    to_copy_calls: aten::_to_copy calls; top_ops: the largest self times with their shares.
    """
    cuda = device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync(device)
    with profile(activities=activities) as prof:
        with record_function(STEP):
            step()
        _sync(device)
    events = prof.events()
    span = next(e for e in events if e.name == STEP and e.device_type == DeviceType.CPU).time_range
    kernels = [(e.time_range.start, e.time_range.end) for e in events if e.device_type == DeviceType.CUDA]
    end = max([span.end, *(k[1] for k in kernels)])
    averages = prof.key_averages()
    self_time = (lambda a: a.self_device_time_total) if cuda else (lambda a: a.self_cpu_time_total)
    timed = [a for a in averages if a.key != STEP and self_time(a) > 0]
    total = sum(self_time(a) for a in timed) or 1.0
    counts = {a.key: a.count for a in averages}
    return {
        "step_wall_ms": (end - span.start) / 1e3,
        "device_kernels": len(kernels) if cuda else None,
        "launch_calls": sum(counts.get(name, 0) for name in LAUNCHES) if cuda else None,
        "gpu_busy": _union_us(kernels) / (end - span.start) if cuda else None,
        "device_time_ms": total / 1e3,
        "copy_share": sum(self_time(a) for a in timed if a.key in COPY_OPS) / total,
        "to_copy_calls": counts.get("aten::_to_copy", 0),
        "top_ops": [
            {"op": a.key, "calls": a.count, "ms": self_time(a) / 1e3, "share": self_time(a) / total}
            for a in sorted(timed, key=self_time, reverse=True)[:TOP]
        ],
    }
