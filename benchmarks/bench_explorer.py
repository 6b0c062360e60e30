"""The explorer on a device: a block's first computation and every block switch, through the page's own requests.

    python benchmarks/bench_explorer.py [--model lkat_base_patch16_224] [--device cuda] [--images 32]
                                        [--blocks 3,7] [--repeats 3] [--out benchmarks/results/explorer_<device>.json]

Builds the real app (`lkat_lens.apps.explorer.create_app`) for a seeded random-init model saved as a lkat-lens
checkpoint (digits data at the model's input size: the sample loads on any machine, and the cost depends on shapes,
not on what the weights learned). A block change is what the page sends when the block dropdown changes: one POST to
Dash's `/_dash-update-component` (Flask's test client, no browser) for every callback that reads the block, with
the tab open, answered and JSON-serialised by Dash as in the browser; callbacks of hidden tabs answer 204 as there.
For each tab (edges, gates, tokens) and each block of `--blocks`: the first computation, then `--repeats` rounds of
switching between those computed blocks. Prints and writes wall seconds (start-up too: on a GPU the explorer runs
one forward at start-up, `Study.warm_up`, so that a process's one-time kernel costs are not the first block's) and
the peak GPU memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch
from common import device_name, write_result  # benchmarks/ is the script folder

import lkat_lens  # noqa: F401 (registers the models with timm)
from lkat_lens.apps.explorer import create_app
from lkat_lens.checkpoint import save_checkpoint
from lkat_lens.data import NORMALIZATION
from lkat_lens.models import create_model
from lkat_lens.study import resolve_device

TABS = ("edges", "gates", "tokens")
UPDATE = "/_dash-update-component"


def random_checkpoint(model_name: str, folder: Path) -> Path:
    """A seeded random-init model saved as a lkat-lens checkpoint with digits data at its input size."""
    torch.manual_seed(0)
    model = create_model(model_name, num_classes=10)
    mean, std = NORMALIZATION["digits"]
    size = model.patch_embed.img_size[0]
    data = {"name": "digits", "img_size": size, "mean": mean, "std": std, "class_names": [str(d) for d in range(10)]}
    path = folder / f"{model_name}.pt"
    save_checkpoint(
        path, model_name=model_name, model_kwargs={"num_classes": 10}, state_dict=model.state_dict(), data=data
    )
    return path


def outputs_of(key: str) -> list[dict[str, str]] | dict[str, str]:
    """The outputs a callback_map key names ("..a.figure...b.figure.." for several, "a.figure" for one)."""
    if not key.startswith(".."):
        ident, prop = key.rsplit(".", 1)
        return {"id": ident, "property": prop}
    return [dict(zip(("id", "property"), part.rsplit(".", 1), strict=True)) for part in key[2:-2].split("...")]


def block_requests(app: Any, values: dict[str, Any]) -> list[dict[str, Any]]:
    """The request bodies the page posts when the block changes: one per callback that reads block.value (the
    selection's own URL sync left out), with the inputs and states set from `values` (None where not given)."""
    bodies = []
    for key, spec in app.callback_map.items():
        inputs = [(i["id"], i["property"]) for i in spec["inputs"]]
        if ("block", "value") not in inputs or ("url", "search") in inputs:
            continue
        bodies.append(
            {
                "output": key,
                "outputs": outputs_of(key),
                "inputs": [{"id": i, "property": p, "value": values.get(i)} for i, p in inputs],
                "state": [
                    {"id": s["id"], "property": s["property"], "value": values.get(s["id"])} for s in spec["state"]
                ],
                "changedPropIds": ["block.value"],
            }
        )
    return bodies


def switch(client: Any, app: Any, tab: str, block: int) -> float:
    """Seconds for the page's block change to `block` on `tab`: every block callback answered."""
    values = {"tabs": tab, "checkpoint": 0, "block": block, "image": 0, "head": 1, "edge-layer": "fc1"}
    values |= {"rollout-method": "attention", "telemetry-scope": "block"}
    start = time.perf_counter()
    codes = []
    for body in block_requests(app, values):
        answer = client.post(UPDATE, json=body)
        if answer.status_code not in (200, 204):
            raise RuntimeError(f"{body['output']}: HTTP {answer.status_code}: {answer.get_data(as_text=True)[:500]}")
        codes.append(answer.status_code)
    seconds = time.perf_counter() - start
    if 200 not in codes:
        raise RuntimeError(f"no callback of the {tab!r} tab answered block {block}")
    return seconds


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lkat_base_patch16_224")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--images", type=int, default=32, help="the explorer's sample (lkat-lens explore's default)")
    parser.add_argument("--edges", type=int, default=8, help="edge functions per layer grid (explore's default)")
    parser.add_argument("--blocks", default="3,7", help="the blocks computed and switched between")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="default: benchmarks/results/explorer_<device>.json")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    blocks = [int(b) for b in args.blocks.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        path = random_checkpoint(args.model, Path(folder))
        begun = time.perf_counter()
        app = create_app(path, num_images=args.images, edges=args.edges, probe_images=2, device=str(device))
        app.explorer_state[0].sample  # noqa: B018 (loaded before the timings)
        startup = time.perf_counter() - begun
    client = app.server.test_client()
    ckpt = app.explorer_state[0]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    first: dict[str, dict[int, float]] = {}
    switches: dict[str, list[float]] = {}
    for tab in TABS:
        first[tab] = {}
        for block in blocks:
            first[tab][block] = switch(client, app, tab, block)
            synchronize(device)
            print(f"{tab}: block {block} first computed in {first[tab][block]:.2f} s", flush=True)
        switches[tab] = [switch(client, app, tab, block) for _ in range(args.repeats) for block in blocks]
        print(f"{tab}: switches {min(switches[tab]):.3f}-{max(switches[tab]):.3f} s", flush=True)
    per_block_first = [sum(first[tab][b] for tab in TABS) for b in blocks]
    per_round = [sum(rounds) for rounds in zip(*switches.values(), strict=True)]
    result = {
        "model": f"{args.model} (random init, seeded)",
        "images": args.images,
        "edges": args.edges,
        "blocks": blocks,
        "device": device_name(device),
        "study_device": str(ckpt.device),
        "torch": torch.__version__,
        "date": date.today().isoformat(),
        "seconds": {
            "create_app_with_sample": startup,
            "of_which_warm_up": ckpt.warm_up_seconds,
            "first_computation_by_tab": {tab: {str(b): s for b, s in by.items()} for tab, by in first.items()},
            "first_computation_of_a_block_all_tabs": max(per_block_first),
            "switch_by_tab": {tab: {"median": statistics.median(s), "max": max(s)} for tab, s in switches.items()},
            "switch_all_tabs": {"median": statistics.median(per_round), "max": max(per_round)},
        },
        "goal_seconds": {"first_computation": 3.0, "switch": 0.3},
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    print(json.dumps(result, indent=1))
    write_result(args.out or f"benchmarks/results/explorer_{device.type}.json", result, indent=1)


if __name__ == "__main__":
    main()
