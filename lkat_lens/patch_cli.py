"""`lkat-lens patch`: activation patching, ablations with controls, direct logit attribution and the logit lens of
one image against a corruption; writes interventions.json and the figures."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import torch

from .analyses import interventions as iv
from .analyses.parts import has_head_outputs
from .analyses.serialize import json_ready
from .figures import interventions as figs
from .figures.export import write_figures
from .images import load_image
from .study import Study

DEFAULT_REFERENCE = 16  # sample images the ablations' mean and resample draw from


def image_spec(spec: str) -> int | Path:
    """A sample index ("3") or an image file."""
    return int(spec) if spec.strip().isdigit() else Path(spec)


def corrupt_spec(spec: str) -> str | int | Path:
    """A corruption name, a sample index or an image file."""
    return spec if spec in iv.CORRUPTIONS else image_spec(spec)


def parse_points(spec: str, available: set[str]) -> list[str]:
    """Hook points from "all" (every one the model has) or a comma list such as "resid_pre,heads"."""
    has = [p for p, suffix in iv.POINTS.items() if f"blocks.0.{suffix}" in available]
    if spec.strip().lower() == "all":
        return has
    points = [p.strip() for p in spec.split(",") if p.strip()]
    unknown = [p for p in points if p not in has]
    if unknown or not points:
        raise ValueError(f"--points {spec!r}: this model's points are {', '.join(has)} (or 'all')")
    return points


def load_input(study: Study, spec: int | Path) -> tuple[torch.Tensor, dict[str, Any]]:
    """The image [1, C, H, W] and a description of where it came from."""
    if isinstance(spec, int):
        size = len(study.sample.images)
        if spec >= size:
            raise ValueError(
                f"sample image {spec} out of range: the {study.info.data['name']} sample has {size} images"
            )
        return study.images(spec), {"sample_image": spec, "label": int(study.sample.labels[spec])}
    loaded = load_image(spec, study.info.data)
    return loaded.tensor[None], {"file": str(spec), "notes": list(loaded.notes)}


def run_patch(args: argparse.Namespace) -> dict[str, Any]:
    """Run every intervention the options ask for; write interventions.json and the figures into args.out."""
    clean_spec, corrupt = image_spec(args.clean), corrupt_spec(args.corrupt)
    indices = [s for s in (clean_spec, corrupt) if isinstance(s, int)]
    needed = max([i + 1 for i in indices] + [args.reference_images + 1 if args.ablate != "none" else 0] + [1])
    study = Study.open(
        args.checkpoint,
        variant=args.variant,
        data=args.data,
        data_dir=args.data_dir,
        device=args.device,
        num_images=needed,
    )
    model = study.model
    clean, clean_info = load_input(study, clean_spec)
    if isinstance(corrupt, str):
        corrupted = iv.corrupt(clean, corrupt, patch_size=study.patch_size, seed=args.seed)
        corrupt_info = {"corruption": corrupt, "seed": args.seed}
    else:
        corrupted, corrupt_info = load_input(study, corrupt)
    points = parse_points(args.points, set(model.hook_points()))
    patching = {p: iv.activation_patching(model, clean, corrupted, p, target=args.target) for p in points}
    ablation = None
    if args.ablate != "none":
        reference = study.sample.images[: args.reference_images + 1]
        if isinstance(clean_spec, int):
            reference = torch.cat([reference[:clean_spec], reference[clean_spec + 1 :]])
        reference = reference[: args.reference_images]
        ablation = iv.ablate(model, clean, args.ablate, reference=reference, target=args.target, seed=args.seed)
    dla = iv.direct_logit_attribution(model, clean, args.target, heads=has_head_outputs(model))
    lens = iv.logit_lens(model, clean, args.target)
    report = {
        "checkpoint": str(args.checkpoint),
        "clean": clean_info,
        "corrupt": corrupt_info,
        "patching": {p: r.to_dict() for p, r in patching.items()},
        "ablation": None if ablation is None else ablation.to_dict(),
        "logit_attribution": dla.to_dict(),
        "logit_lens": lens.to_dict(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "interventions.json").write_text(json.dumps(json_ready(report), allow_nan=False) + "\n")
    drawn: dict[str, go.Figure] = {f"patch_{p}": figs.patching_figure(r) for p, r in patching.items()}
    if ablation is not None:
        drawn[f"ablation_{args.ablate}"] = figs.ablation_figure(ablation)
    drawn["logit_attribution"] = figs.dla_figure(dla)
    if dla.head_totals is not None:
        drawn["logit_attribution_heads"] = figs.dla_heads_figure(dla)
    drawn["logit_lens"] = figs.logit_lens_figure(lens)
    paths = write_figures(drawn, out, args.fmt)
    print(f"wrote {out / 'interventions.json'} and {len(paths)} figures to {out}")
    return report


def cmd_patch(args: argparse.Namespace) -> None:
    """The `lkat-lens patch` subcommand."""
    if args.reference_images < 2 and args.ablate != "none":
        raise ValueError(f"--reference-images must be at least 2 for ablations, got {args.reference_images}")
    run_patch(args)
