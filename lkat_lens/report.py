"""`lkat-lens analyze`: every analysis of a checkpoint on a sample of its data, as one JSON report."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from lkat_lens.analyses.serialize import json_ready

from .analyses import attention, attributions, edge_functions, gates, probes, tokens
from .checkpoint import CheckpointInfo
from .data import build_dataset, eval_transform_for


@dataclass
class Sample:
    """Evaluation-transformed images [N, C, H, W] with their labels [N]."""

    images: torch.Tensor
    labels: torch.Tensor


def load_sample(
    data: dict[str, Any], split: str, num: int, *, name: str | None = None, data_dir: str | os.PathLike = "data"
) -> Sample:
    """The first `num` images of a dataset split (seeded shuffle), transformed as the checkpoint was evaluated."""
    dataset = build_dataset(name or data["name"], split, data_dir=data_dir, transform=eval_transform_for(data))
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))[:num]
    images, labels = zip(*(dataset[int(i)] for i in order), strict=True)
    return Sample(torch.stack(images), torch.as_tensor(labels))


def analyses_for(model: nn.Module, sample: Sample, probe_train: Sample, attribution_images: int) -> dict[str, Callable]:
    """The analyses that apply to `model`, by report key."""
    few = sample.images[:attribution_images]

    def attribution_report() -> dict[str, Any]:
        ig = attributions.attribute(model, few, "integrated_gradients", n_steps=64)
        curves = attributions.deletion_insertion(model, few, ig)
        return {"integrated_gradients": ig.to_dict(pixels=False), "faithfulness": curves.to_dict()}

    jobs: dict[str, Callable] = {}
    if edge_functions.kan_layers(model):
        jobs["edge_functions"] = lambda: edge_functions.summarize_edge_functions(model, sample.images).to_dict()
    if any(name.endswith("hook_gk") for name in model.list_hooks()):
        jobs["gates"] = lambda: gates.gate_statistics(model, sample.images).to_dict()
    jobs["cls_attention"] = lambda: attention.cls_attention(model, few).to_dict()
    jobs["rollout"] = lambda: attention.attention_rollout(model, few, method="gradient").to_dict()
    jobs["tokens"] = lambda: tokens.token_norms(model, sample.images).to_dict()
    jobs["attributions"] = attribution_report
    jobs["probes"] = lambda: probes.linear_probes(
        model, probe_train.images, probe_train.labels, sample.images, sample.labels
    ).to_dict()
    return jobs


def analyze(
    model: nn.Module,
    info: CheckpointInfo,
    sample: Sample,
    probe_train: Sample,
    *,
    attribution_images: int = 4,
    progress: bool = True,
) -> dict[str, Any]:
    """Run every applicable analysis and return the JSON-ready report."""
    model.eval()
    with torch.no_grad():
        logits = model(sample.images)
    report: dict[str, Any] = {
        "checkpoint": info.path,
        "model": {
            "name": info.model_name,
            "kwargs": info.model_kwargs,
            "parameters": sum(p.numel() for p in model.parameters()),
        },
        "data": {k: v for k, v in info.data.items() if k != "class_names"},
        "sample": {
            "images": len(sample.labels),
            "probe_train_images": len(probe_train.labels),
            "top1": (logits.argmax(-1) == sample.labels).float().mean().item(),
        },
    }
    jobs = analyses_for(model, sample, probe_train, attribution_images)
    for key, job in tqdm(jobs.items(), desc="analyses", disable=not progress):
        report[key] = job()
    return json_ready(report)


def write_report(report: dict[str, Any], path: str | os.PathLike) -> None:
    """Write the report as strict JSON (atomically)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(report, indent=1, allow_nan=False))
    os.replace(tmp, path)
