"""Plot the resolution sweep of bench_model.py --sweep: images/s and peak memory against resolution.

    python benchmarks/plot_resolution.py benchmarks/results/bench_model_sweep-<gpu>-<date>.json

Writes docs/resolution_sweep.html and docs/resolution_sweep.png (static export through kaleido and a
Chromium on PATH). Left: training and inference images/s of LKAT-S and ViT-S (log-log), the crossover
marked. Right: training peak memory per image against tokens per image (log-log: slope 1 is linear growth).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

DOCS = Path(__file__).resolve().parent.parent / "docs"
COLORS = {"LKAT-S": "#d62728", "ViT-S": "#1f77b4"}


def family(row: dict) -> str:
    """LKAT-S or ViT-S."""
    return "LKAT-S" if row["model"].startswith("lkat") else "ViT-S"


def figure(result: dict) -> go.Figure:
    """Throughput and memory panels of one sweep result."""
    rows = [r for r in result["rows"] if "error" not in r]
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("throughput (bf16, batch ~ 25k patch tokens)", "training peak memory")
    )
    for name, color in COLORS.items():
        own = sorted((r for r in rows if family(r) == name), key=lambda r: r["img_size"])
        imgs = [r["img_size"] for r in own]
        for key, dash in (("train", "solid"), ("infer", "dot")):
            fig.add_trace(
                go.Scatter(
                    x=imgs,
                    y=[r[f"{key}_img_s"] for r in own],
                    name=f"{name} {key}",
                    mode="lines+markers",
                    line=dict(color=color, dash=dash),
                    customdata=[[r["batch"], r["tokens"]] for r in own],
                    hovertemplate="%{x}² · batch %{customdata[0]} · %{customdata[1]} tokens: %{y:.1f} img/s",
                ),
                row=1,
                col=1,
            )
        fig.add_trace(
            go.Scatter(
                x=[r["tokens"] for r in own],
                y=[r["train_peak_GiB"] / r["batch"] for r in own],
                name=f"{name} GiB / image",
                mode="lines+markers",
                line=dict(color=color),
                text=[f"{r['img_size']}², batch {r['batch']}, peak {r['train_peak_GiB']:.1f} GiB" for r in own],
                hovertemplate="%{text}: %{y:.3f} GiB / image",
            ),
            row=1,
            col=2,
        )
    crossing = (result.get("crossover") or {}).get("train")
    if crossing:
        fig.add_vline(x=crossing["img_size"], line_dash="dash", line_color="gray", row=1, col=1)
        fig.add_annotation(
            x=crossing["img_size"],
            y=1,
            yref="y domain",
            text=f"train crossover ~{crossing['img_size']}²",
            showarrow=False,
            xanchor="left",
            row=1,
            col=1,
        )
    env = rows[0] if rows else {}
    fig.update_xaxes(type="log", title_text="image side (pixels)", row=1, col=1)
    fig.update_yaxes(type="log", title_text="images / s", row=1, col=1)
    fig.update_xaxes(type="log", title_text="tokens per image", row=1, col=2)
    fig.update_yaxes(type="log", title_text="GiB per image (peak / batch)", row=1, col=2)
    fig.update_layout(
        title=f"LKAT-S vs ViT-S (SDPA) across resolution — {env.get('gpu', '')}, torch {env.get('torch', '')}, "
        f"{env.get('date', '')}",
        width=1200,
        height=500,
        template="plotly_white",
        legend=dict(orientation="h", y=-0.2),
    )
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_json", type=Path)
    parser.add_argument("--out", type=Path, default=DOCS / "resolution_sweep", help="path without suffix")
    args = parser.parse_args()
    fig = figure(json.loads(args.sweep_json.read_text()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(args.out.with_suffix(".html"), include_plotlyjs="cdn")
    fig.write_image(args.out.with_suffix(".png"), scale=2)
    print(f"wrote {args.out.with_suffix('.html')} and .png")


if __name__ == "__main__":
    main()
