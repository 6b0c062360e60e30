"""Training telemetry: what happens inside each block while a model learns, measured on a fixed probe batch.

Every quantity that an analysis already computes comes from that analysis (gates.gate_statistics,
tokens.token_norms, edge_functions.layer_statistics / edge_importance), so telemetry and `lkat-lens analyze`
agree on the same batch (the share of the RBF grid span a KAN layer's inputs occupy is analyses.grid_span's). One
quantity no analysis has is defined here: the ratio of a KAN layer's output norm to the residual-stream norm.
Records are one JSON object per line in telemetry.jsonl; docs/telemetry.md documents the schema.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from .analyses.edge_functions import edge_importance, layer_statistics
from .analyses.gates import gate_statistics, half_life
from .analyses.grid_span import grid_span_share
from .analyses.parts import eval_mode, gla_blocks, kan_layers
from .analyses.serialize import json_ready
from .analyses.tokens import TokenNorms, token_norms
from .telemetry_records import SCHEMA, append_record, keep_records_up_to, telemetry_path

# Diagnostic thresholds (docs/telemetry.md)
DORMANT_RATIO = 1e-3  # a KAN layer whose mean output norm is below this share of the residual norm is dormant
OUTSIDE_SHARE = 0.2  # more than this share of a KAN layer's inputs outside the grid support
SATURATED_ALPHA = 0.999  # a head whose 5 % gate quantile is above this never forgets ...
CLOSED_ALPHA = 0.01  # ... one whose 95 % gate quantile is below this forgets at once
TOP_EDGES = 5


def probe_batch(dataset: Dataset, num_images: int, seed: int) -> torch.Tensor:
    """A fixed batch of `num_images` images of `dataset`, drawn by a generator seeded with `seed`."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))
    return torch.stack([dataset[int(i)][0] for i in order[: min(num_images, len(dataset))]])


def output_residual_ratio(out: torch.Tensor, resid: torch.Tensor) -> float:
    """Mean token L2 norm of a layer's output over the mean token L2 norm of the residual stream it reads."""
    return float(out.double().norm(dim=-1).mean() / resid.double().norm(dim=-1).mean())


def parameter_norms(model: nn.Module, block: int) -> tuple[float, float | None]:
    """L2 norm of block `block`'s weights and of their current gradients (None before any backward)."""
    params = list(model.blocks[block].parameters())
    weight = torch.linalg.vector_norm(torch.stack([p.detach().double().norm() for p in params]))
    grads = [p.grad.detach().double().norm() for p in params if p.grad is not None]
    grad = float(torch.linalg.vector_norm(torch.stack(grads))) if grads else None
    return float(weight), grad


def _kan_hook_names(model: nn.Module) -> dict[str, tuple[str, str, str]]:
    """Per KAN layer: the hook names of its input, its output and the residual stream its block's MLP reads."""
    points = set(model.list_hooks())
    names = {}
    for name in kan_layers(model):
        block = name.split(".mlp.")[0]
        resid = f"{block}.hook_resid_mid" if f"{block}.hook_resid_mid" in points else f"{block}.hook_resid_pre"
        names[name] = (f"{name}.hook_in", f"{name}.hook_out", resid)
    return names


def _kan_telemetry(
    model: nn.Module, images: torch.Tensor, cache: dict[str, torch.Tensor], top_k: int
) -> dict[str, dict[str, Any]]:
    """Per KAN layer: inputs outside the grid support, grid span occupied, output/residual ratio, top edges."""
    layers = kan_layers(model)
    if not layers:
        return {}
    stats = layer_statistics(model, images)
    result = {}
    for name, (hook_in, hook_out, resid) in _kan_hook_names(model).items():
        rbf = layers[name].rbf
        result[name] = {
            "outside_fraction": stats[name].coverage.outside_fraction,
            "grid_span_share": grid_span_share(cache[hook_in], rbf.grid_min, rbf.grid_max),
            "output_residual_ratio": output_residual_ratio(cache[hook_out], cache[resid]),
            "top_edges": [list(e) for e in edge_importance(layers[name], stats[name]).top_edges(top_k)],
        }
    return result


def _token_telemetry(norms: TokenNorms, blocks: list[dict[str, Any]]) -> None:
    """Per block entry: mean residual norm after the block per token type, and its outlier patches."""
    groups = norms.group_norms()
    registers = [g for name, g in groups.items() if name.startswith("register_")]
    for i, entry in enumerate(blocks):
        entry["resid_norm"] = {
            "patches": float(groups["patches"][i + 1].mean()),
            **({"registers": float(torch.cat([g[i + 1] for g in registers], -1).mean())} if registers else {}),
            **({"cls": float(groups["cls"][i + 1].mean())} if "cls" in groups else {}),
        }
        entry["outlier_patches"] = int(norms.outliers[i + 1].sum())


def measure(model: nn.Module, images: torch.Tensor, top_k: int = TOP_EDGES) -> list[dict[str, Any]]:
    """One entry per block of everything telemetry records, measured on `images` in eval mode."""
    depth = len(model.blocks)
    blocks: list[dict[str, Any]] = [{"block": i} for i in range(depth)]
    for i, entry in enumerate(blocks):
        entry["weight_norm"], entry["grad_norm"] = parameter_norms(model, i)
    wanted = {n for names in _kan_hook_names(model).values() for n in names}
    cache: dict[str, torch.Tensor] = {}

    def keep(tensor: torch.Tensor, hook: nn.Module) -> None:
        cache[hook.name] = tensor.detach()

    with eval_mode(model), torch.no_grad():
        images = images.to(next(model.parameters()).device)
        with model.hooks(fwd_hooks=[(wanted.__contains__, keep)]):  # the KAN hooks ride on token_norms' forward
            if hasattr(model, "patch_embed"):  # token norms need a patch grid (MLP-Mixer has none)
                _token_telemetry(token_norms(model, images), blocks)
            elif wanted:
                model(images)
        if gla_blocks(model):
            gates = gate_statistics(model, images)
            by_type = gates.head_half_life_by_type
            head_quantiles = half_life(gates.head_log_alpha_quantiles)
            for row, i in enumerate(gates.blocks):
                blocks[i]["gates"] = {
                    "quantile_levels": gates.quantile_levels.tolist(),
                    "alpha_quantiles": gates.head_log_alpha_quantiles[row].exp().tolist(),
                    "half_life_quantiles": json_ready(head_quantiles[row]),
                    "half_life_by_type": {name: json_ready(h[row]) for name, h in by_type.items()},
                }
        for name, values in _kan_telemetry(model, images, cache, top_k).items():
            block = int(name.split(".")[1])
            blocks[block].setdefault("kan", {})[name.rsplit(".", 1)[-1]] = values
    return blocks


def diagnose(record: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, message) for each warning a record raises: dormant KAN layer, inputs off the grid, saturated gates."""
    found = []
    for entry in record["blocks"]:
        b = entry["block"]
        for layer, kan in entry.get("kan", {}).items():
            if kan["output_residual_ratio"] < DORMANT_RATIO:
                found.append(
                    (
                        f"dormant/{b}/{layer}",
                        f"block {b} {layer}: KAN layer dormant (output norm {kan['output_residual_ratio']:.1e} of "
                        f"the residual norm, threshold {DORMANT_RATIO:g})",
                    )
                )
            if kan["outside_fraction"] > OUTSIDE_SHARE:
                found.append(
                    (
                        f"outside/{b}/{layer}",
                        f"block {b} {layer}: {100 * kan['outside_fraction']:.0f}% of KAN inputs outside the grid "
                        f"support (threshold {100 * OUTSIDE_SHARE:.0f}%)",
                    )
                )
        gates = entry.get("gates")
        if gates is not None:
            levels = gates["quantile_levels"]
            low, high = levels.index(0.05), levels.index(0.95)
            for h, q in enumerate(gates["alpha_quantiles"]):
                where = f"block {b} head {h}: forget gates saturated"
                if q[low] > SATURATED_ALPHA:
                    found.append((f"open/{b}/{h}", f"{where} open (95% of gate values above {SATURATED_ALPHA})"))
                elif q[high] < CLOSED_ALPHA:
                    found.append((f"closed/{b}/{h}", f"{where} closed (95% of gate values below {CLOSED_ALPHA})"))
    return found


class Telemetry:
    """Writes a run's telemetry records and prints each diagnostic once."""

    def __init__(
        self,
        run_dir: Path,
        probe: torch.Tensor,
        log: Callable[[str], None],
        top_k: int = TOP_EDGES,
        quiet_epochs: int = 0,
    ):
        """`quiet_epochs`: epochs recorded but not diagnosed (the trainer passes the lr warmup's)."""
        self.path, self.probe, self.log, self.top_k = telemetry_path(run_dir), probe, log, top_k
        self.quiet_epochs = quiet_epochs
        self.seen: set[str] = set()

    def resume(self, epoch: int, step: int) -> None:
        """Continue after a checkpoint at (epoch, step): later records are dropped, diagnostics stay said once."""
        for record in keep_records_up_to(self.path, epoch, step):
            if record["kind"] == "epoch" and record["epoch"] > self.quiet_epochs:
                self.seen.update(key for key, _ in diagnose(record))

    def record(self, model: nn.Module, *, kind: str, epoch: int, step: int) -> dict[str, Any]:
        """Measure the model on the probe batch, append the record and log new diagnostics; returns the record."""
        start = time.perf_counter()
        blocks = measure(model, self.probe, self.top_k)
        record = {"schema": SCHEMA, "kind": kind, "epoch": epoch, "step": step, "images": len(self.probe)}
        record.update(blocks=blocks, cost_s=time.perf_counter() - start)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        append_record(self.path, record)
        for key, message in diagnose(record) if kind == "epoch" and epoch > self.quiet_epochs else ():
            if key not in self.seen:
                self.seen.add(key)
                self.log(f"diagnostic: {message}")
        return record
