"""`lkat-lens figures`: run the analyses on a checkpoint's data and write every figure, plus an index.html."""

from __future__ import annotations

import argparse
import dataclasses
import html
import os
from collections.abc import Sequence
from pathlib import Path

import plotly.graph_objects as go
import torch
from tqdm.auto import tqdm

from . import distributed, figures
from .analyses.edge_functions import EdgeCurves
from .figures.export import FORMATS, STATIC_FORMATS, check_static_export, write_figures
from .figures.training import telemetry_figures
from .images import display_images
from .runs import checkpoint_of, run_folder_of
from .study import Study, progress_bar


def parse_blocks(spec: str, num_blocks: int) -> list[int]:
    """Block indices from "all" or a comma list like "0,5,11" (sorted, unique, validated)."""
    if spec.strip().lower() == "all":
        return list(range(num_blocks))
    try:
        chosen = sorted({int(part) for part in spec.split(",") if part.strip()})
    except ValueError:
        raise ValueError(f"--blocks must be 'all' or comma-separated block numbers, got {spec!r}") from None
    bad = [b for b in chosen if not 0 <= b < num_blocks]
    if not chosen or bad:
        raise ValueError(f"--blocks {spec!r}: the model has blocks 0..{num_blocks - 1}")
    return chosen


def check_kan_blocks(study: Study, blocks: Sequence[int]) -> None:
    """Refuse blocks without KAN layers: edge-function figures need RBF-KAN MLPs."""
    missing = [b for b in blocks if not study.block_layers(b)]
    if missing:
        raise ValueError(f"blocks {missing} have no KAN layer; edge-function figures need RBF-KAN MLPs")


def edge_figures(study: Study, blocks: Sequence[int], bar: tqdm) -> dict[str, go.Figure]:
    """Per block and KAN layer the edge-function grid (blockNN_<layer>_curves), plus the all-blocks overview."""
    figs: dict[str, go.Figure] = {}
    drawn: dict[int, dict[str, EdgeCurves]] = {}
    for block in blocks:
        bar.set_description(f"edge functions, block {block}")
        drawn[block] = {}
        for short in study.block_layers(block):
            curves, scores, stats = study.edge_curves(block, short)
            share = study.span_share(block, short)
            figs[f"block{block:02d}_{short}_curves"] = figures.edge_layer_figure(
                block, short, curves, stats, scores, span_share=share
            )
            drawn[block][short] = curves
        bar.update()
    figs["edge_overview"] = figures.edge_overview_figure(
        {b: {k: _first(c, 8) for k, c in per.items()} for b, per in drawn.items()}
    )
    return figs


def analysis_figures(study: Study, bar: tqdm) -> dict[str, go.Figure]:
    """Gate half-lives, token norms, class-token attention and attribution overlays on the sample."""
    figs: dict[str, go.Figure] = {}
    if study.has_gates:
        bar.set_description("forget-gate figures")
        gate_stats = study.gate_statistics()
        figs["gates_half_life_map"] = figures.gate_half_life_figure(gate_stats)
        figs["gates_half_life_heads"] = figures.gate_head_figure(gate_stats)
    bar.update()
    bar.set_description("token norms")
    figs["token_norms"] = figures.token_norm_figure(study.token_norms())
    bar.update()
    few = slice(0, study.defaults.attribution_images)
    shown = display_images(study.images(few), study.info.data)
    if study.has_class_token:
        bar.set_description("class-token attention")
        figs["cls_attention"] = figures.cls_attention_figure(
            study.cls_attention_maps(), shown, patch_size=study.patch_size
        )
    bar.update()
    bar.set_description("Integrated Gradients")
    figs["attributions"] = figures.attribution_figure(study.attribution(few, "integrated_gradients"), shown)
    bar.update()
    return figs


def write_index(paths: Sequence[Path], out: Path, title: str) -> Path:
    """An index.html that shows every figure file (images inline, PDFs and HTML embedded)."""
    parts = [
        f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>",
        f"<body style='font-family:sans-serif'>\n<h1>{html.escape(title)}</h1>",
    ]
    for path in paths:
        name, ref = html.escape(path.stem), html.escape(path.name)
        parts.append(f"<h2 id='{name}'>{name}</h2>")
        if path.suffix in (".png", ".svg"):
            parts.append(f"<p><a href='{ref}'><img src='{ref}' alt='{name}' style='max-width:100%'></a></p>")
        else:
            parts.append(f"<p><iframe src='{ref}' title='{name}' style='width:100%;height:80vh;border:0'></iframe></p>")
    parts.append("</body></html>\n")
    index = out / "index.html"
    index.write_text("\n".join(parts))
    return index


def make_figures(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    *,
    fmt: str = "png",
    blocks: str = "all",
    edges: int = 16,
    data: str | None = None,
    data_dir: str | os.PathLike = "data",
    masks_dir: str | os.PathLike | None = None,
    num_images: int = 64,
    overlay_images: int = 4,
    seed: int = 0,
    variant: str | None = None,
    progress: bool | None = None,
    device: str | torch.device | None = None,
    batch_size: int = 64,
) -> list[Path]:
    """Load a checkpoint, analyse a seeded sample of its data, and write every figure plus index.html. Under a
    torch.distributed process group every rank calls this: the streamed statistics are shared out over the ranks,
    every rank draws the same figures, and rank 0 alone writes them (the others get an empty list)."""
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {FORMATS}, got {fmt!r}")
    if edges < 1:
        raise ValueError(f"--edges must be at least 1, got {edges}")
    if batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {batch_size}")
    if fmt in STATIC_FORMATS:
        check_static_export()
    torch.manual_seed(seed)
    run = run_folder_of(checkpoint)
    study = Study.open(
        checkpoint_of(checkpoint),
        variant=variant,
        data=data,
        data_dir=data_dir,
        masks_dir=masks_dir,
        num_images=num_images,
        edges=edges,
        attribution_images=overlay_images,
        device=device,
        batch_size=batch_size,
        progress=progress,
    )
    chosen = parse_blocks(blocks, study.num_blocks)
    check_kan_blocks(study, chosen)
    with progress_bar(progress if study.is_main else False, total=len(chosen) + 7, unit="step") as bar:
        bar.set_description("loading the data sample")
        study.sample  # noqa: B018 (loaded here so the bar names the step)
        bar.update()
        figs = edge_figures(study, chosen, bar) | analysis_figures(study, bar)
        bar.set_description("training telemetry")
        records = run.telemetry() if run else []
        figs |= {f"training_{name}": fig for name, fig in telemetry_figures(records).items()}
        bar.update()
        if not study.is_main:
            return []
        bar.set_description(f"writing {len(figs)} {fmt} files")
        out = Path(out)
        paths = write_figures(figs, out, fmt)
        write_index(paths, out, f"lkat-lens figures: {study.path.name} ({study.info.model_name})")
        bar.update()
    return paths


def _first(curves: EdgeCurves, k: int) -> EdgeCurves:
    """The same curves restricted to the first k edges (the most important)."""
    scales = None if curves.scales is None else curves.scales[:k]
    base = None if curves.base_values is None else curves.base_values[:k]
    bias = None if curves.base_bias is None else curves.base_bias[:k]
    return dataclasses.replace(
        curves, edges=curves.edges[:k], values=curves.values[:k], scales=scales, base_values=base, base_bias=bias
    )


def cmd_figures(args: argparse.Namespace) -> None:
    """Write every figure of a checkpoint to args.out; under torchrun the ranks share the streamed statistics out
    (rank 0 writes the figures)."""
    device = args.device
    if distributed.launched_by_torchrun():
        device = distributed.setup(args.device or "auto").device
    try:
        paths = _figures_of(args, device)
    finally:
        distributed.teardown()
    if paths:
        print(f"wrote {len(paths)} figures and index.html to {args.out}")


def _figures_of(args: argparse.Namespace, device: str | torch.device | None) -> list[Path]:
    """make_figures with the command line's settings."""
    return make_figures(
        args.checkpoint,
        args.out,
        fmt=args.fmt,
        blocks=args.blocks,
        edges=args.edges,
        data=args.data,
        data_dir=args.data_dir,
        masks_dir=args.masks,
        num_images=args.num_images,
        overlay_images=args.overlay_images,
        seed=args.seed,
        variant=args.variant,
        device=device,
        batch_size=args.batch_size,
        progress=args.progress,
    )
