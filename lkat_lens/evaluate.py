"""`lkat-lens evaluate`: are the maps right? Every relevance map of a `Study` scored against the sample's object
masks (analyses.faithfulness): the methods x metrics table as JSON, and its figures (a thin front end)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from .analyses.faithfulness import HIGHER_IS_BETTER, MAP_METHODS, MethodEvaluation, map_methods
from .analyses.serialize import json_ready, write_json
from .figures.export import check_static_export, write_figures
from .figures.faithfulness import evaluation_figures
from .study import Study


def parse_methods(spec: str, study: Study) -> list[str]:
    """'all' (every method the model has) or a comma-separated list of MAP_METHODS."""
    available = map_methods(study.model)
    if spec == "all":
        return list(available)
    chosen = [m.strip() for m in spec.split(",") if m.strip()]
    for method in chosen:
        if method not in MAP_METHODS:
            raise ValueError(f"unknown method {method!r} in --methods; choose from {', '.join(MAP_METHODS)}")
        if method not in available:
            raise ValueError(f"--methods: {method} needs a class token, which this model does not have")
    if not chosen:
        raise ValueError("--methods names no method")
    return chosen


def evaluate(
    study: Study, methods: Sequence[str], explain: str = "predicted", *, progress: bool = True
) -> dict[str, MethodEvaluation]:
    """Each method's evaluation on the study's sample (computed once, cached in the study)."""
    study.object_masks()  # a clear error before any work
    results = {}
    with tqdm(total=len(methods), disable=not progress, unit="method") as bar:
        for method in methods:
            bar.set_description(method)
            results[method] = study.map_evaluation(method, explain)
            bar.update()
    return results


def evaluation_report(study: Study, results: dict[str, MethodEvaluation], explain: str) -> dict[str, Any]:
    """The JSON report: the table (methods x metrics, means over images), how it was measured, every method's
    per-image scores, mean curves and MPRT curve."""
    masks = study.object_masks()
    return json_ready(
        {
            "checkpoint": str(study.path),
            "model": study.card(),
            "sample": {
                "images": len(study.sample.labels),
                "top1_percent": study.sample_top1,
                "mask_area_mean": masks.double().mean().item(),
                "mprt_images": min(study.defaults.mprt_images, len(study.sample.labels)),
            },
            "explains": "each image's predicted class" if explain == "predicted" else "each image's true class",
            "higher_is_better": HIGHER_IS_BETTER,
            "table": {method: result.summary() for method, result in results.items()},
            "methods": {method: result.to_dict() for method, result in results.items()},
        }
    )


def write_evaluation(
    study: Study, results: dict[str, MethodEvaluation], explain: str, out: str | os.PathLike, fmt: str = "png"
) -> list[Path]:
    """Write out/evaluation.json and the figures out/evaluation_*.<fmt>; returns the paths."""
    out = Path(out)
    report = evaluation_report(study, results, explain)
    write_json(report, out / "evaluation.json")
    return [out / "evaluation.json", *write_figures(evaluation_figures(results), out, fmt)]


def format_table(table: dict[str, dict[str, float]]) -> str:
    """The table as aligned text lines (methods x metrics)."""
    metrics = list(next(iter(table.values())))
    width = max(len(m) for m in table)
    head = " " * width + "".join(f" {m[:14]:>14}" for m in metrics)
    rows = [f"{method:<{width}}" + "".join(f" {row[m]:>14.3f}" for m in metrics) for method, row in table.items()]
    return "\n".join([head, *rows])


def cmd_evaluate(args: argparse.Namespace) -> None:
    """Score every relevance map against the object masks and write the JSON table and figures."""
    if args.fmt != "html":
        check_static_export()
    torch.manual_seed(args.seed)
    study = Study.open(
        args.checkpoint,
        variant=args.variant,
        data=args.data,
        data_dir=args.data_dir,
        masks_dir=args.masks,
        num_images=args.num_images,
        mprt_images=args.mprt_images,
        device=args.device,
        batch_size=args.batch_size,
    )
    methods = parse_methods(args.methods, study)
    results = evaluate(study, methods, args.explain)
    paths = write_evaluation(study, results, args.explain, args.out, args.fmt)
    print(format_table({method: result.summary() for method, result in results.items()}))
    print(f"wrote {', '.join(str(p) for p in paths)}")
