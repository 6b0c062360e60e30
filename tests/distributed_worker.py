"""What one gloo rank of tests/test_distributed_stats.py runs (a light module: spawned processes import it)."""

import torch
import torch.distributed as dist

import lkat_lens
from lkat_lens.analyses import distributed_stats, edge_functions, gates, grid_span, tokens

NUM_IMAGES, BATCH = 13, 4  # uneven shards (7 and 6 images) whose batches do not line up with one process's


def streamed(over_ranks: bool) -> dict:
    """Every streamed statistic of a seeded lkat_micro on seeded images (this rank's shard when over_ranks)."""
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_micro", num_classes=10).eval()
    images = torch.randn(NUM_IMAGES, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    mine = distributed_stats.shard(images) if over_ranks else images
    with torch.no_grad():
        found = {
            "layers": edge_functions.layer_statistics(model, mine, batch_size=BATCH, over_ranks=over_ranks),
            "gates": gates.gate_statistics(model, mine, batch_size=BATCH, quantile_images=9, over_ranks=over_ranks),
            "tokens": tokens.token_norms(model, mine, batch_size=BATCH, over_ranks=over_ranks),
            "spans": grid_span.layer_span_shares(model, mine, batch_size=BATCH, max_images=10, over_ranks=over_ranks),
        }
        summary = edge_functions.summarize_edge_functions(model, mine, batch_size=BATCH, over_ranks=over_ranks)
    found["summary_images"] = summary.num_images
    return found


def worker(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks: stream this rank's shard; rank 0 saves the combined statistics."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        found = streamed(over_ranks=True)
        if rank == 0:
            torch.save(found, out)
    finally:
        dist.destroy_process_group()
