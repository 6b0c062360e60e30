"""`lkat-lens figures`: run the analyses on a checkpoint's data and write every figure, plus an index.html."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import html
import importlib.util
import os
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import torch
from torch import nn
from tqdm.auto import tqdm

from lkat_lens.analyses.edge_functions import EdgeCurves, LayerStatistics

from . import figures
from .analyses import attention, attributions, edge_functions, gates, tokens
from .report import Sample, load_sample

FORMATS = ("png", "svg", "pdf", "html")
STATIC_FORMATS = ("png", "svg", "pdf")
NO_BROWSER = (
    "static export needs a Chromium-based browser on PATH (kaleido drives it); install Debian's chromium "
    "(apt-get install chromium) or use --format html"
)


class BrowserNotFoundError(FileNotFoundError):
    """No Chromium-based browser for kaleido's static export (a user error: the CLI exits 2)."""


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


def block_layers(model: nn.Module, blocks: Sequence[int]) -> dict[int, dict[str, str]]:
    """Per block, its KAN layers as short name ("fc1") -> full module name."""
    names = edge_functions.kan_layers(model)
    found = {b: {n.rsplit(".", 1)[-1]: n for n in names if n.startswith(f"blocks.{b}.")} for b in blocks}
    missing = [b for b, layers in found.items() if not layers]
    if missing:
        raise ValueError(f"blocks {missing} have no KAN layer; edge-function figures need RBF-KAN MLPs")
    return found


def top_edge_curves(layer: nn.Module, stats: LayerStatistics, k: int) -> tuple[EdgeCurves, list[float]]:
    """Curves of the layer's k most important edges on the default grid, and their importance (std)."""
    top = edge_functions.edge_importance(layer, stats).top_edges(k)
    curves = edge_functions.edge_curves(layer, [(q, p) for q, p, _ in top])
    return curves, [score for _, _, score in top]


def edge_figures(
    model: nn.Module,
    stats: Mapping[str, LayerStatistics],
    layers: Mapping[int, Mapping[str, str]],
    edges: int,
    progress: bool = True,
) -> tuple[dict[str, go.Figure], dict[int, dict[str, EdgeCurves]]]:
    """Per block and KAN layer the edge-function grid (named blockNN_<layer>_curves), and the curves drawn."""
    modules = edge_functions.kan_layers(model)
    figs: dict[str, go.Figure] = {}
    drawn: dict[int, dict[str, EdgeCurves]] = {}
    for block, per_block in tqdm(layers.items(), desc="blocks", disable=not progress):
        drawn[block] = {}
        for short, name in per_block.items():
            curves, scores = top_edge_curves(modules[name], stats[name], edges)
            title = f"block {block} {short}: top {len(scores)} edge functions by std over real inputs"
            figs[f"block{block:02d}_{short}_curves"] = figures.edge_curve_figure(
                curves, stats[name].coverage, scores=scores, title=title
            )
            drawn[block][short] = curves
    return figs, drawn


def display_images(images: torch.Tensor, data: Mapping) -> np.ndarray:
    """Normalised images [B, C, H, W] back to displayable uint8 RGB [B, H, W, 3]."""
    mean = torch.tensor(data["mean"], dtype=images.dtype).view(1, -1, 1, 1)
    std = torch.tensor(data["std"], dtype=images.dtype).view(1, -1, 1, 1)
    pixels = (images * std + mean).clamp(0, 1)
    if pixels.shape[1] == 1:
        pixels = pixels.expand(-1, 3, -1, -1)
    return (pixels[:, :3] * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


def analysis_figures(model: nn.Module, sample: Sample, data: Mapping, num_images: int) -> dict[str, go.Figure]:
    """Gate half-lives, token norms, class-token attention and attribution overlays on the sample."""
    figs: dict[str, go.Figure] = {}
    if any(name.endswith("hook_gk") for name in model.list_hooks()):
        gate_stats = gates.gate_statistics(model, sample.images)
        figs["gates_half_life_map"] = figures.gate_half_life_figure(gate_stats)
        figs["gates_half_life_heads"] = figures.gate_head_figure(gate_stats)
    figs["token_norms"] = figures.token_norm_figure(tokens.token_norms(model, sample.images))
    few = sample.images[:num_images]
    shown = display_images(few, data)
    patch = attributions.model_patch_size(model)
    figs["cls_attention"] = figures.cls_attention_figure(attention.cls_attention(model, few), shown, patch_size=patch)
    ig = attributions.attribute(model, few, "integrated_gradients", n_steps=32)
    figs["attributions"] = figures.attribution_figure(ig, shown)
    return figs


def find_browser() -> str | None:
    """The Chromium-based browser kaleido would use, or None."""
    from choreographer.browsers.chromium import Chromium

    return Chromium.find_browser(skip_local=False)


def check_static_export() -> None:
    """Raise BrowserNotFoundError unless kaleido and a Chromium-based browser are both there."""
    if importlib.util.find_spec("kaleido") is None:
        raise BrowserNotFoundError("static export needs kaleido (pip install 'kaleido>=1'); or use --format html")
    if find_browser() is None:
        raise BrowserNotFoundError(NO_BROWSER)


@contextmanager
def export_server() -> Iterator[None]:
    """Kaleido's export server (one browser) for the duration of a with-block."""
    check_static_export()
    import kaleido

    kaleido.start_sync_server(silence_warnings=True)
    try:
        yield
    finally:
        kaleido.stop_sync_server(silence_warnings=True)


def write_figures(figs: Mapping[str, go.Figure], out: Path, fmt: str) -> list[Path]:
    """Write each figure as out/<name>.<fmt> (static formats through one kaleido server); returns the paths."""
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {FORMATS}, got {fmt!r}")
    out.mkdir(parents=True, exist_ok=True)
    figs = {name: with_trace_ids(fig, name) for name, fig in figs.items()}
    paths = [out / f"{name}.{fmt}" for name in figs]
    if fmt == "html":
        for (name, fig), path in zip(figs.items(), paths, strict=True):
            fig.write_html(path, include_plotlyjs="directory", div_id=name, full_html=True)
        return paths
    with export_server(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The kopts argument is ignored")
        pio.write_images(
            list(figs.values()),
            paths,
            format=fmt,
            width=[fig.layout.width for fig in figs.values()],
            height=[fig.layout.height for fig in figs.values()],
        )
    for path in paths:
        make_reproducible(path)
    return paths


def with_trace_ids(fig: go.Figure, name: str) -> go.Figure:
    """A copy whose traces have fixed uids (plotly.js draws random ones into SVG class names otherwise)."""
    fig = go.Figure(fig)
    for i, trace in enumerate(fig.data):
        trace.uid = f"{name}-{i}"
    return fig


def make_reproducible(path: Path) -> None:
    """Replace what Chromium varies between runs: PDF dates (fixed) and the SVG's random id (hash of the name)."""
    if path.suffix == ".pdf":
        data = path.read_bytes()
        path.write_bytes(re.sub(rb"/(CreationDate|ModDate) \(D:\d{14}", rb"/\1 (D:20000101000000", data))
    elif path.suffix == ".svg":
        text = path.read_text()
        found = re.search(r'<defs id="defs-([0-9a-f]+)"', text)
        if found:
            uid = hashlib.sha1(path.name.encode()).hexdigest()[: len(found[1])]
            path.write_text(re.sub(rf'(clip|defs-|legend|["#]g){found[1]}', rf"\g<1>{uid}", text))


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
    num_images: int = 64,
    overlay_images: int = 4,
    seed: int = 0,
    variant: str | None = None,
    progress: bool = True,
) -> list[Path]:
    """Load a checkpoint, analyse a seeded sample of its data, and write every figure plus index.html."""
    from .checkpoint import load

    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {FORMATS}, got {fmt!r}")
    if edges < 1:
        raise ValueError(f"--edges must be at least 1, got {edges}")
    if fmt in STATIC_FORMATS:
        check_static_export()
    torch.manual_seed(seed)
    model, info = load(checkpoint, variant=variant)
    if not info.data:
        raise ValueError(f"{checkpoint} records no dataset or normalisation; figures need a lkat-lens checkpoint")
    model.eval()
    layers = block_layers(model, parse_blocks(blocks, len(model.blocks)))
    sample = load_sample(info.data, "val", num_images, name=data, data_dir=data_dir)
    names = [name for per_block in layers.values() for name in per_block.values()]
    stats = edge_functions.layer_statistics(model, sample.images, layers=names)
    figs, drawn = edge_figures(model, stats, layers, edges, progress)
    figs["edge_overview"] = figures.edge_overview_figure(
        {b: {k: _first(c, 8) for k, c in per.items()} for b, per in drawn.items()}
    )
    figs |= analysis_figures(model, sample, info.data, overlay_images)
    out = Path(out)
    paths = write_figures(figs, out, fmt)
    write_index(paths, out, f"lkat-lens figures: {Path(checkpoint).name} ({info.model_name})")
    return paths


def _first(curves: EdgeCurves, k: int) -> EdgeCurves:
    """The same curves restricted to the first k edges (the most important)."""
    scales = None if curves.scales is None else curves.scales[:k]
    base = None if curves.base_values is None else curves.base_values[:k]
    bias = None if curves.base_bias is None else curves.base_bias[:k]
    return dataclasses.replace(
        curves, edges=curves.edges[:k], values=curves.values[:k], scales=scales, base_values=base, base_bias=bias
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `figures` subcommand's arguments."""
    parser.add_argument("checkpoint")
    parser.add_argument("--out", default="figures", help="output folder")
    parser.add_argument("--format", choices=FORMATS, default="png", dest="fmt")
    parser.add_argument("--blocks", default="all", help="'all' or block numbers such as 0,5,11")
    parser.add_argument("--edges", type=int, default=16, help="edge functions per layer grid (most important first)")
    parser.add_argument("--data", help="dataset name (default: the checkpoint's)")
    parser.add_argument("--data-dir", default="data", help="where cifar/imagefolder data live")
    parser.add_argument("--num-images", type=int, default=64, help="held-out images analysed")
    parser.add_argument("--overlay-images", type=int, default=4, help="images shown with attention/attribution maps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variant", help="registry name, for a reference-code state_dict")


def cmd_figures(args: argparse.Namespace) -> None:
    """Write every figure of a checkpoint to args.out."""
    paths = make_figures(
        args.checkpoint,
        args.out,
        fmt=args.fmt,
        blocks=args.blocks,
        edges=args.edges,
        data=args.data,
        data_dir=args.data_dir,
        num_images=args.num_images,
        overlay_images=args.overlay_images,
        seed=args.seed,
        variant=args.variant,
    )
    print(f"wrote {len(paths)} figures and index.html to {args.out}")
