"""Figure builders hold the data of the analyses they draw; `lkat-lens figures` writes every file."""

import math
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from tolerance import assert_allclose
from tqdm.auto import tqdm

from lkat_lens import figures, figures_cli
from lkat_lens.analyses import attention, attributions, edge_functions, gates, grid_span, parts, tokens
from lkat_lens.checkpoint import CheckpointInfo
from lkat_lens.data import Sample
from lkat_lens.figures import export
from lkat_lens.figures.training import QUANTITIES
from lkat_lens.images import display_images
from lkat_lens.study import Study
from lkat_lens_cli import build_parser, run_user_command

needs_chromium = pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian chromium for kaleido export")


@pytest.fixture(scope="module")
def stats(lkat, images):
    """Statistics of every KAN layer of lkat_micro over two images."""
    return edge_functions.layer_statistics(lkat, images)


def test_edge_curve_figure_holds_the_curves(lkat, stats):
    name = "blocks.1.mlp.fc1"
    layer = parts.kan_layers(lkat)[name]
    curves, scores = edge_functions.top_edge_curves(layer, stats[name], 6)
    expected = edge_functions.edge_curves(layer, curves.edges)
    fig = figures.edge_curve_figure(curves, stats[name].coverage, scores=scores)
    assert len(fig.data) == 3 * 6
    rbf = layer.rbf
    grid_range = [rbf.grid_min - 2 * rbf.bandwidth, rbf.grid_max + 2 * rbf.bandwidth]
    counts = stats[name].coverage.counts.double()
    for e in range(6):
        shade, curve, centers = fig.data[3 * e : 3 * e + 3]
        np.testing.assert_array_equal(curve.y, expected.values[e].numpy())
        np.testing.assert_array_equal(curve.x, expected.x.numpy())
        assert_allclose(centers.x, torch.linspace(rbf.grid_min, rbf.grid_max, rbf.num_grids).numpy())
        heights = np.asarray(shade.y)
        assert_allclose(heights / heights.max(), (counts / counts.max()).numpy(), rtol=1e-12)
        axis = fig.layout[f"xaxis{'' if e == 0 else e + 1}"]
        assert list(axis.range) == pytest.approx(grid_range, abs=1e-12)
    assert scores == sorted(scores, reverse=True)
    imp = edge_functions.edge_importance(layer, stats[name])
    assert curves.edges.tolist() == [[q, p] for q, p, _ in imp.top_edges(6)]


def test_edge_overview_has_one_trace_per_curve(lkat):
    layers = parts.kan_layers(lkat)
    drawn = {
        b: {s: edge_functions.edge_curves(layers[f"blocks.{b}.mlp.{s}"], [(0, 0), (1, 2)]) for s in ("fc1", "fc2")}
        for b in (0, 1)
    }
    fig = figures.edge_overview_figure(drawn)
    assert len(fig.data) == 2 * 2 * 2
    np.testing.assert_array_equal(fig.data[3].y, drawn[0]["fc2"].values[1].numpy())


def test_gate_figures_hold_half_lives(lkat, images):
    stats = gates.gate_statistics(lkat, images)
    fig = figures.gate_half_life_figure(stats)
    maps = stats.half_life_map
    n_blocks, n_heads = maps.shape[:2]
    assert len(fig.data) == n_blocks * n_heads
    for i in range(n_blocks):
        for h in range(n_heads):
            z = np.asarray(fig.data[i * n_heads + h].z, dtype=float)
            ref = maps[i, h].numpy()
            np.testing.assert_array_equal(np.isnan(z), ~np.isfinite(ref))
            np.testing.assert_array_equal(z[np.isfinite(ref)], ref[np.isfinite(ref)])
    heads = figures.gate_head_figure(stats)
    by_type = stats.head_half_life_by_type
    assert [t.name for t in heads.data] == list(by_type)
    np.testing.assert_array_equal(np.asarray(heads.data[0].z, dtype=float), by_type["patches"].numpy())
    # every panel has block 0 at the top and integer ticks, so one row is one block across the token types
    panels = [heads.layout.yaxis] + [heads.layout[f"yaxis{i}"] for i in range(2, len(by_type) + 1)]
    assert all(axis.autorange == "reversed" and list(axis.tickvals) == stats.blocks for axis in panels)
    assert all(list(t.x) == list(range(n_heads)) for t in heads.data)
    # the per-patch maps keep square cells however wide they are drawn
    assert [fig.layout[f"yaxis{i + 1 if i else ''}"].scaleanchor for i in range(len(fig.data))] == [
        f"x{i + 1 if i else ''}" for i in range(len(fig.data))
    ]
    assert list(heads.layout.xaxis.tickvals) == list(heads.layout.xaxis2.tickvals) == list(range(n_heads))


def test_probe_depth_axis_has_integer_ticks(lkat, images):
    from lkat_lens.analyses import probes

    labels = torch.arange(len(images)) % 2
    results = probes.linear_probes(lkat, images, labels, images, labels)
    fig = figures.probe_figure(results)
    assert list(fig.layout.xaxis.tickvals) == list(range(len(results.depth_names)))


def test_plot_values_turn_infinity_into_gaps():
    assert figures.as_plot_values(torch.tensor([[1.5, math.inf], [-math.inf, math.nan]])) == [[1.5, None], [None, None]]


def test_token_norm_figure(lkat, images):
    norms = tokens.token_norms(lkat, images)
    fig = figures.token_norm_figure(norms)
    groups = norms.group_norms()
    assert [t.name for t in fig.data] == [*groups, "patch median", "outlier threshold"]
    assert_allclose(fig.data[0].y, groups["patches"].double().mean((1, 2)).numpy(), rtol=1e-12)
    np.testing.assert_array_equal(fig.data[-1].y, norms.thresholds.numpy())


def test_map_figures_hold_attention_and_attributions(lkat, images):
    shown = display_images(images, {"mean": [0.5] * 3, "std": [0.25] * 3})
    assert shown.shape == (2, 16, 16, 3) and shown.dtype == np.uint8
    cls = attention.cls_attention(lkat, images)
    fig = figures.cls_attention_figure(cls, shown, patch_size=(4, 4))
    n_blocks = len(cls.blocks)
    assert len(fig.data) == 2 * (1 + 2 * n_blocks)
    heat = fig.data[2]  # image 0: image, then block 0's image and heatmap
    assert_allclose(heat.z, cls.patch_maps[0, 0].double().mean(0).numpy(), rtol=1e-12)
    assert (heat.x0, heat.dx) == (1.5, 4)
    ig = attributions.attribute(lkat, images, "integrated_gradients", n_steps=8)
    fig = figures.attribution_figure(ig, shown)
    assert len(fig.data) == 2 * 3
    np.testing.assert_array_equal(fig.data[2].z, ig.pixel_map[0].double().numpy())
    assert fig.layout.coloraxis.cmax == pytest.approx(float(ig.pixel_map.abs().max()))


def test_parse_blocks():
    assert figures_cli.parse_blocks("all", 3) == [0, 1, 2]
    assert figures_cli.parse_blocks("2,0,2", 3) == [0, 2]
    for bad in ("3", "a", ""):
        with pytest.raises(ValueError):
            figures_cli.parse_blocks(bad, 3)


def test_builders_are_deterministic(lkat, stats):
    name = "blocks.0.mlp.fc2"
    layer = parts.kan_layers(lkat)[name]
    jsons = [
        figures.edge_curve_figure(
            edge_functions.top_edge_curves(layer, stats[name], 4)[0], stats[name].coverage
        ).to_json()
        for _ in range(2)
    ]
    assert jsons[0] == jsons[1]


def _expected_names(blocks: list[int]) -> list[str]:
    curves = [f"block{b:02d}_{s}_curves" for b in blocks for s in ("fc1", "fc2")]
    return [
        *curves,
        "edge_overview",
        "gates_half_life_map",
        "gates_half_life_heads",
        "token_norms",
        "cls_attention",
        "attributions",
        *TRAINING,  # the checkpoint sits in its run folder, whose telemetry.jsonl the figures draw too
    ]


TRAINING = [f"training_{name}" for name in QUANTITIES]


def run_figures(argv: list[str]) -> int:
    """Run the `figures` subcommand as the CLI does (user errors exit 2)."""
    args = build_parser().parse_args(["figures", *argv])
    return run_user_command(lambda: figures_cli.cmd_figures(args))


@needs_chromium
def test_cli_writes_every_png(digits_checkpoint, tmp_path):
    out = tmp_path / "figs"
    argv = [str(digits_checkpoint), "--out", str(out), "--edges", "4", "--num-images", "16", "--overlay-images", "2"]
    assert run_figures(argv) == 0
    names = _expected_names([0, 1, 2, 3])
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{n}.png" for n in names] + ["index.html"])
    for n in names:
        with Image.open(out / f"{n}.png") as img:
            img.load()
            assert img.format == "PNG" and img.width >= 300 and img.height >= 300, n
    with Image.open(out / "block00_fc1_curves.png") as img:
        assert img.width == 4 * figures.PANEL_PX + 80  # four panels a row
        assert figures.PANEL_PX + 100 < img.height < 2 * figures.PANEL_PX + 100  # one row of them, under the key
    index = (out / "index.html").read_text()
    assert all(f"src='{n}.png'" in index for n in names)


@needs_chromium
@pytest.mark.parametrize("fmt", ["svg", "pdf"])
def test_vector_export_is_reproducible(lkat, images, tmp_path, fmt):
    fig = figures.token_norm_figure(tokens.token_norms(lkat, images))
    outs = [export.write_figures({"token_norms": fig}, tmp_path / run, fmt)[0] for run in "ab"]
    assert outs[0].read_bytes() == outs[1].read_bytes()
    assert outs[0].read_bytes().startswith(b"%PDF" if fmt == "pdf" else b"<svg")


def test_make_figures_refuses_counts_below_one(tmp_path):
    """The Python API checks what the command line's argparse types check, before any file is read."""
    for option, value in (("edges", 0), ("batch_size", -1)):
        flag = "--" + option.replace("_", "-")
        with pytest.raises(ValueError, match=f"{flag} must be at least 1, got {value}"):
            figures_cli.make_figures(tmp_path / "missing.pt", tmp_path / "out", fmt="html", **{option: value})
    assert not (tmp_path / "out").exists()


def test_cli_html_without_browser(digits_checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(export, "find_browser", lambda: None)
    argv = [str(digits_checkpoint), "--blocks", "1", "--edges", "2", "--num-images", "8", "--overlay-images", "1"]
    assert run_figures([*argv, "--format", "png", "--out", str(tmp_path / "png")]) == 2
    assert "chromium" in capsys.readouterr().err
    assert not (tmp_path / "png").exists()
    runs = [tmp_path / "a", tmp_path / "b"]
    for out in runs:
        assert run_figures([*argv, "--format", "html", "--out", str(out), "--progress"]) == 0
        progress = capsys.readouterr().err  # the bar names each step, from the sample to the files written
        for step in ["loading the data sample", "edge functions, block 1", "token norms", "writing"]:
            assert step in progress, progress[-2000:]
    files = sorted(p.name for p in runs[0].iterdir())
    assert files == sorted([f"{n}.html" for n in _expected_names([1])] + ["index.html", "plotly.min.js"])
    for name in files:
        assert (runs[0] / name).read_bytes() == (runs[1] / name).read_bytes(), name


@pytest.mark.timed
def test_lkat_base_edge_grids_build_fast():
    """All 24 edge-function grids of a random-weight LKAT-B (real importance over two images) build in < 60 s."""
    import time

    import timm

    torch.manual_seed(0)
    model = timm.create_model("lkat_base_patch16_224").eval()
    info = CheckpointInfo("random-init", "lkat_base_patch16_224", {}, data={"name": "none", "img_size": 224})
    study = Study(model, info)
    study.sample = Sample(torch.randn(2, 3, 224, 224), torch.zeros(2, dtype=torch.long))
    study.layer_statistics()
    start = time.perf_counter()
    figs = figures_cli.edge_figures(study, range(12), tqdm(disable=True))
    elapsed = time.perf_counter() - start
    curves = {name: fig for name, fig in figs.items() if name.endswith("_curves")}
    assert len(curves) == 24 and all(len(f.data) == 3 * 16 for f in curves.values())
    assert elapsed < 60, f"building 24 LKAT-B grids took {elapsed:.1f} s"


def test_attribution_figure_names_images_and_flags_unconverged_ig(lkat, images):
    shown = display_images(images[:2], {"mean": [0.5] * 3, "std": [0.25] * 3})
    ig = attributions.attribute(lkat, images[:2], "integrated_gradients", n_steps=2)
    ig.delta_ratio, ig.converged = torch.tensor([0.01, 0.3]), False  # image 1 far from complete
    fig = figures.attribution_figure(ig, shown, names=["image 3", "cat.png"])
    labels = [a.text for a in fig.layout.annotations]
    assert labels[0].startswith("image 3 (class ") and labels[1].startswith("cat.png (class ")
    named = figures.attribution_figure(
        ig, shown, names=["image 3", "cat.png"], class_names=[f"c{i}" for i in range(10)]
    )
    targets = ig.target.tolist()
    assert [a.text for a in named.layout.annotations[:2]] == [
        f"image 3 (class c{targets[0]})",
        f"cat.png (class c{targets[1]})",
    ]
    assert "|Δ| 1.0% of gap, 2 steps" in labels[2] and "not converged" not in labels[2]
    assert "|Δ| 30.0% of gap" in labels[3] and "⚠ not converged" in labels[3]
    assert "NOT converged after 2 steps" in fig.layout.title.text.replace("<br>", " ")


def test_edge_grid_explains_itself(lkat, stats):
    layer = parts.kan_layers(lkat)["blocks.0.mlp.fc1"]
    curves, scores = edge_functions.top_edge_curves(layer, stats["blocks.0.mlp.fc1"], 6)
    fig = figures.edge_layer_figure(0, "fc1", curves, stats["blocks.0.mlp.fc1"], scores)
    title = fig.layout.title.text
    assert "input p to output q" in title and "σ: std of φ" in title and "RBF centres" in title
    assert "shared basis: every panel is the same curve" in title  # lkat_micro's default basis
    assert [t.name for t in fig.data if t.showlegend] == [
        "input distribution",
        "φ(x), the edge function",
        "RBF centres",
    ]
    assert fig.layout.xaxis5.title.text == "input x" and fig.layout.yaxis.title.text == "φ(x)"
    assert fig.layout.yaxis.tickformat == fig.layout.xaxis.tickformat == ".3~g"


def coverage_of(layer, x: torch.Tensor):
    """The Coverage the library computes for a KAN layer fed the edge-function inputs x [n, in]."""
    moments = edge_functions.LayerMoments(layer)
    moments.update(x, torch.zeros(x.shape[0], layer.out_features), x_raw=x)
    return moments.statistics().coverage


def test_sliver_layers_are_flagged_in_coverage_and_edge_grids(lkat, stats):
    """Issue 13 item 7: the share of the grid the inputs occupy (analyses.grid_span) is in each coverage panel's
    title and each edge grid's key, flagged under grid_span.SLIVER."""
    name = "blocks.0.mlp.fc1"
    layer = parts.kan_layers(lkat)["blocks.0.mlp.fc1"]
    curves, scores = edge_functions.top_edge_curves(layer, stats[name], 4)
    gen = torch.Generator().manual_seed(1)
    sliver_x = 5e-9 * torch.randn(400, layer.in_features, generator=gen)
    spread_x = torch.randn(400, layer.in_features, generator=gen)
    grid = (layer.rbf.grid_min, layer.rbf.grid_max)
    shares = {"fc1": grid_span.grid_span_share(spread_x, *grid), "fc2": grid_span.grid_span_share(sliver_x, *grid)}
    assert shares["fc2"] < grid_span.SLIVER < shares["fc1"]
    coverages = {"fc1": coverage_of(layer, spread_x), "fc2": coverage_of(layer, sliver_x)}
    fig = figures.coverage_figure(coverages, curves.centers.tolist(), span_shares=shares)
    spread_title, sliver_title = (a.text for a in fig.layout.annotations[:2])
    assert f"occupy {shares['fc1']:.0%} of the grid" in spread_title and "sliver" not in spread_title
    assert "⚠ a sliver" in sliver_title and "0.0% outside support" in sliver_title
    assert "occupy" not in figures.coverage_figure(coverages).layout.annotations[0].text  # no shares, no claim
    flagged = figures.edge_curve_figure(curves, coverages["fc2"], scores=scores, span_share=shares["fc2"])
    assert "⚠ a sliver: each curve is only read there" in flagged.layout.title.text
    fine = figures.edge_curve_figure(curves, coverages["fc1"], scores=scores, span_share=shares["fc1"])
    assert "sliver" not in fine.layout.title.text and "occupy" in fine.layout.title.text


def test_importance_heatmap_frames_the_selected_edge():
    edge_std = torch.rand(10, 7, generator=torch.Generator().manual_seed(0))
    (frame,) = figures.importance_figure(edge_std, selected=(6, 3)).layout.shapes  # one cell per edge
    assert (frame.x0, frame.x1, frame.y0, frame.y1) == (2.5, 3.5, 5.5, 6.5)
    (frame,) = figures.importance_figure(edge_std, max_cells=4, selected=(7, 5)).layout.shapes  # 3x2 tiles
    assert (frame.x0, frame.x1, frame.y0, frame.y1) == (3.0, 5.0, 4.5, 7.5)  # the tile of rows 6-8, columns 4-5
    assert "framed: φ[7,5]" in figures.importance_figure(edge_std, max_cells=4, selected=(7, 5)).layout.title.text
    assert not figures.importance_figure(edge_std).layout.shapes


def test_long_image_grid_titles_wrap_within_the_figure(lkat, images):
    shown = display_images(images[:1], {"mean": [0.5] * 3, "std": [0.25] * 3})
    found = attributions.attribute(lkat, images[:1], "saliency")
    text = (
        "integrated_gradients attribution of the predicted class<br>"
        "in my neighbour's black and white cat, sitting on a garden wall at dusk.png"
    )
    fig = figures.attribution_figure(found, shown, title=text)
    lines = fig.layout.title.text.split("<br>")
    assert len(lines) == 3 and " ".join(lines) == text.replace("<br>", " ")
    assert all(len(line) <= fig.layout.width // figures.TITLE_CHAR_PX for line in lines)
    assert fig.layout.margin.t >= 60 + 17 * 2  # room for three lines
