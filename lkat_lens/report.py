"""`lkat-lens analyze`: every analysis of a `Study` as one JSON report (a thin front end, docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .analyses.grid_span import is_sliver
from .analyses.serialize import json_ready
from .study import NeedsLabelsError, Study, progress_bar

OVER_RANKS = ("edge_functions", "grid_span", "gates", "tokens")  # the streamed statistics every rank takes part in


def attribution_report(study: Study) -> dict[str, Any]:
    """Integrated Gradients on the first sample images, with its convergence and deletion/insertion curves."""
    few = slice(0, study.defaults.attribution_images)
    ig = study.attribution(few, "integrated_gradients")
    curves = study.faithfulness(few, "integrated_gradients")
    return {"integrated_gradients": ig.to_dict(pixels=False), "faithfulness": curves.to_dict()}


def grid_span_report(study: Study) -> dict[str, dict[str, Any]]:
    """Per KAN layer: the share of its RBF grid its inputs occupy and whether that is a sliver."""
    return {name: {"occupied_share": share, "sliver": is_sliver(share)} for name, share in study.span_shares().items()}


def analyses_for(study: Study) -> dict[str, tuple[str, Callable[[], Any]]]:
    """The analyses that apply to the study's model: report key -> (step name, job)."""
    few = slice(0, study.defaults.attribution_images)
    jobs: dict[str, tuple[str, Callable[[], Any]]] = {}
    if study.has_kan:
        jobs["edge_functions"] = ("KAN edge functions", lambda: study.edge_summary().to_dict())
        jobs["grid_span"] = ("grid span of the KAN inputs", lambda: grid_span_report(study))
    if study.has_gates:
        jobs["gates"] = ("GLA forget gates", lambda: study.gate_statistics().to_dict())
    if study.has_class_token:
        jobs["cls_attention"] = ("class-token attention", lambda: study.cls_attention_maps().to_dict())
        jobs["rollout"] = ("gradient rollout", lambda: study.rollout(few, "gradient").to_dict())
    jobs["tokens"] = ("token norms", lambda: study.token_norms().to_dict())
    jobs["attributions"] = ("Integrated Gradients", lambda: attribution_report(study))
    if study.has_labels:
        jobs["probes"] = ("linear probes", lambda: study.probes().to_dict())
    return jobs


def sample_report(study: Study) -> dict[str, Any]:
    """The sample's size and top-1 accuracy; without labels the analyses left out and why (under `left_out`)."""
    found: dict[str, Any] = {"sample": {"images": len(study.sample.labels)}}
    try:
        study.require_labels("top-1 accuracy and linear probes")
    except NeedsLabelsError as err:
        return found | {"left_out": {"top1_percent": str(err), "probes": str(err)}}
    found["sample"] |= {"probe_train_images": len(study.probe_train.labels), "top1_percent": study.sample_top1}
    return found


def analyze(study: Study, *, progress: bool | None = None) -> dict[str, Any] | None:
    """Run every applicable analysis of the study and return the JSON-ready report (progress: a bar naming each
    step; None: at a terminal only). Under `study.over_ranks` every rank calls this: the streamed statistics are
    shared out, the rest runs on rank 0, which alone gets the report (the other ranks get None)."""
    if not study.is_main:  # the same shared passes, in the same order as on rank 0 below
        jobs = analyses_for(study)
        if study.has_labels:
            study.sample_top1  # noqa: B018 (its count is summed over the ranks)
        for key in OVER_RANKS:
            if key in jobs:
                jobs[key][1]()
        return None
    report: dict[str, Any] = {"checkpoint": str(study.path), "model": study.card()}
    with progress_bar(progress, study.progress_file, total=1, unit="step") as bar:
        bar.set_description("loading the data sample")
        report["data"] = {k: v for k, v in study.info.data.items() if k != "class_names"}
        report |= sample_report(study)
        jobs = analyses_for(study)
        bar.total = len(jobs) + 1
        bar.update()
        jobs = {k: jobs[k] for k in OVER_RANKS if k in jobs} | jobs  # the shared passes first, in the ranks' order
        for key, (step, job) in jobs.items():
            bar.set_description(step)
            report[key] = job()
            bar.update()
    return json_ready(report)
