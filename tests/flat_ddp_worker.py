"""What one gloo rank of tests/test_flat_params.py's DDP test runs (a light module: spawned processes import it)."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import lkat_lens
from lkat_lens import recipe as lkrecipe
from lkat_lens.flat_params import FlatParameters

IMAGES = 8  # 4 per rank


def seeded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    return torch.randn(IMAGES, 3, 16, 16, generator=generator), torch.randint(0, 10, (IMAGES,), generator=generator)


def seeded_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return lkat_lens.create_model("lkat_micro", num_classes=10)


def worker(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks: DDP over the flattened model, a backward on this rank's half of the batch; rank 0 saves
    each parameter's gradient (averaged over the ranks by DDP) by name."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model = seeded_model()
        flat = FlatParameters(model, lkrecipe.param_groups(model, 0.05))
        images, labels = (t.chunk(2)[rank] for t in seeded_batch())
        ddp = DistributedDataParallel(flat)  # kept: its reducer averages the gradients during the backward
        torch.nn.functional.cross_entropy(ddp(images), labels).backward()
        if rank == 0:
            with flat.gradients_exposed():
                torch.save({name: p.grad.clone() for name, p in model.named_parameters()}, out)
    finally:
        dist.destroy_process_group()
