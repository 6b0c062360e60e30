"""Streaming statistics over images sharded across torch.distributed ranks (under `torchrun`).

Each rank streams a contiguous shard of the images (rank 0 the first, rank 1 the next, ...), so the ranks' images
in rank order are the images in their one-process order. Sums, counts and histograms are summed over the ranks,
per-image results are concatenated in rank order, and "the first K images" of a quantile are the first K of that
concatenation: every statistic equals the one-process result up to float64 rounding. The analyses take
`over_ranks=True` for this (with a process group initialised, every rank must call them, in the same order);
without it they never touch torch.distributed (the trainer's telemetry runs on rank 0 alone).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def active() -> bool:
    """Whether a process group of more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_size() -> tuple[int, int]:
    """This process's rank and the number of ranks ((0, 1) without a process group)."""
    return (dist.get_rank(), dist.get_world_size()) if active() else (0, 1)


def shard_slice(count: int) -> slice:
    """This rank's contiguous share of `count` items (the first `count % ranks` ranks take one more)."""
    rank, size = rank_and_size()
    if count < size:
        raise ValueError(f"{count} images cannot be shared by {size} ranks; analyse at least {size}")
    base, extra = divmod(count, size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def shard(images: torch.Tensor) -> torch.Tensor:
    """This rank's contiguous shard of the images [N, ...] (all of them without a process group)."""
    return images[shard_slice(images.shape[0])]


def _device() -> torch.device:
    """Where the collectives' tensors live: the current CUDA device under NCCL, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def sum_over_ranks(values: torch.Tensor) -> torch.Tensor:
    """`values` summed over every rank, on the tensor's own device."""
    if not active():
        return values
    total = values.to(_device(), copy=True)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.to(values.device)


def count_over_ranks(count: int) -> int:
    """An integer summed over every rank."""
    return int(sum_over_ranks(torch.tensor(count, dtype=torch.int64)))


def counts_of_ranks(count: int) -> list[int]:
    """Every rank's integer, in rank order."""
    if not active():
        return [count]
    found = torch.zeros(dist.get_world_size(), dtype=torch.int64, device=_device())
    found[dist.get_rank()] = count
    dist.all_reduce(found, op=dist.ReduceOp.SUM)
    return found.tolist()


def cat_over_ranks(values: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Every rank's `values` concatenated along `dim` in rank order (their sizes along `dim` may differ)."""
    if not active():
        return values
    sizes = counts_of_ranks(values.shape[dim])
    moved = values.movedim(dim, 0).to(_device()).contiguous()
    padded = moved.new_zeros((max(sizes), *moved.shape[1:]))
    padded[: moved.shape[0]] = moved
    found = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(found, padded)
    joined = torch.cat([part[:n] for part, n in zip(found, sizes, strict=True)])
    return joined.movedim(0, dim).to(values.device)


def first_over_ranks(values: torch.Tensor, limit: int, dim: int = 0) -> torch.Tensor:
    """The first `limit` entries along `dim` of every rank's `values` concatenated in rank order; each rank passes
    (at least) its own first min(limit, shard size) entries."""
    if not active():
        return values.narrow(dim, 0, min(limit, values.shape[dim]))
    before = sum(counts_of_ranks(values.shape[dim])[: dist.get_rank()])
    return cat_over_ranks(values.narrow(dim, 0, max(0, min(values.shape[dim], limit - before))), dim)
