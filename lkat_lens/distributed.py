"""torchrun/DDP plumbing for the trainer: process group set-up, rank queries and reductions."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


class DeviceError(ValueError):
    """A --device that this machine does not have (a user error)."""


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: rank, world size and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (the one that logs and writes files)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether more than one process trains."""
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    """Whether torchrun (or another launcher) set WORLD_SIZE > 1 for this process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def setup(device: str) -> DistInfo:
    """Join the torchrun process group if there is one (NCCL on CUDA, gloo on CPU) and pick the device."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise DeviceError(f"unknown --device {device!r}: {err}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"--device {device}: no CUDA device is available here")
    if dev.type not in ("cpu", "cuda"):
        raise DeviceError(f"--device {device}: the trainer runs on cpu or cuda")
    if not launched_by_torchrun():
        return DistInfo(0, 1, 0, dev)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if dev.type == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", rank=rank, world_size=world_size, device_id=dev)
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    return DistInfo(rank, world_size, local_rank, dev)


def teardown() -> None:
    """Leave the process group if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    """Wait for every rank (no-op without a process group)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum of `values` over ranks (the tensor itself without a process group)."""
    if dist.is_available() and dist.is_initialized():
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def gather_objects(obj: Any, world_size: int) -> list[Any]:
    """Every rank's `obj`, in rank order (a one-element list without a process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, obj)
    return out
