"""Time whole models on a GPU: a training step and inference, images/s and peak memory; a resolution sweep.

    python benchmarks/bench_model.py                                # main table at 224², eager
    python benchmarks/bench_model.py --sizes small --attn short chunk --compile on   # compiled rows
    python benchmarks/bench_model.py --sweep                         # LKAT-S vs ViT-S, 224² to 2048²

Main table, per size (tiny/small/base): timm's vit_<size>_patch16_224 (SDPA attention), LKAT with each GLA
mode of --attn, and the configuration the paper's code runs (fla's fused_recurrent GLA and the unfused
elementwise RBF op with fp32 output, i.e. KAN backend "torch"; the paper-design Triton RBF kernel is not
in this repository). A training step is forward, backward and a fused AdamW step under bf16 autocast on
synthetic data already on the GPU; inference is a bf16-autocast forward without gradients. Each row carries
ratios to the ViT of its size (same compile setting) and to the paper configuration of its size.
The sweep keeps tokens x batch near --sweep-tokens and reports per-image numbers and the crossover
resolution where LKAT-S starts to train (and infer) faster than ViT-S.
A configuration that runs out of memory (or fails) is recorded with its error and skipped.
Writes JSON (benchmarks/results/ unless --out) and prints markdown.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import timm
import torch
from common import environment  # benchmarks/ is the script folder

import lkat_lens

RESULTS = Path(__file__).parent / "results"
SIZES = {"tiny": "T", "small": "S", "base": "B"}
PAPER = "paper config"


@dataclass(frozen=True)
class Config:
    """One benchmarked model setting."""

    label: str
    model: str
    attn: str | None = None
    kan: str | None = None
    compile: bool = False


def lkat(size: str, attn: str, compile_model: bool = False) -> Config:
    """LKAT of a size with one GLA mode (fused RBF kernel, backend auto)."""
    return Config(f"LKAT-{SIZES[size]} {attn}", f"lkat_{size}_patch16_224", attn=attn, compile=compile_model)


def paper(size: str) -> Config:
    """The paper's code's setting: fla fused_recurrent GLA, unfused torch RBF op with fp32 output."""
    return Config(f"LKAT-{SIZES[size]} {PAPER}", f"lkat_{size}_patch16_224", attn="fused_recurrent", kan="torch")


def vit(size: str, compile_model: bool = False) -> Config:
    """timm's ViT of a size (fused SDPA attention)."""
    return Config(f"ViT-{SIZES[size]}", f"vit_{size}_patch16_224", compile=compile_model)


def build(config: Config, img: int) -> torch.nn.Module:
    """The model of a config on the GPU, with a 1000-class head, for img x img inputs."""
    if config.model.startswith("lkat"):
        model = lkat_lens.create_model(config.model, num_classes=1000, img_size=img)
        model.set_backends(attn=config.attn, kan=config.kan)
    else:
        model = timm.create_model(config.model, pretrained=False, num_classes=1000, img_size=img)
    return model.cuda()


def time_ms(fn, warmup: int, iters: int) -> float:
    """Median milliseconds per call of fn, with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def measure(config: Config, batch: int, img: int, warmup: int, iters: int) -> dict:
    """Training-step and inference time, images/s and peak memory of one config."""
    model = build(config, img)
    step_model = torch.compile(model) if config.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(batch, 3, img, img, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")

    def train_step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(step_model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            step_model(x)

    model.train()
    torch.cuda.reset_peak_memory_stats()
    train = time_ms(train_step, warmup, iters)
    train_mem = torch.cuda.max_memory_allocated() / 2**30
    model.eval()
    torch.cuda.reset_peak_memory_stats()
    inference = time_ms(infer, warmup, iters)
    infer_mem = torch.cuda.max_memory_allocated() / 2**30
    return {
        "params_M": sum(p.numel() for p in model.parameters()) / 1e6,
        "train_ms": train,
        "train_img_s": batch / train * 1e3,
        "train_peak_GiB": train_mem,
        "infer_ms": inference,
        "infer_img_s": batch / inference * 1e3,
        "infer_peak_GiB": infer_mem,
    }


def bench(config: Config, batch: int, img: int, warmup: int, iters: int) -> dict:
    """One row: the config, its shape and measurements, or the error (e.g. out of memory) that stopped it."""
    row = {**asdict(config), "batch": batch, "img_size": img, "tokens": tokens(config, img)}
    try:
        row.update(measure(config, batch, img, warmup, iters))
    except Exception as error:  # record it and go on with the other configs
        row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
    finally:
        gc.collect()
        torch.cuda.empty_cache()
        torch.compiler.reset()
    if "error" in row:
        summary = row["error"]
    else:
        summary = f"train {row['train_img_s']:.0f} img/s, infer {row['infer_img_s']:.0f} img/s"
    print(f"{row['label']} compile={config.compile} img={img} batch={batch}: {summary}", flush=True)
    return row


def tokens(config: Config, img: int) -> int:
    """Sequence length: patches + 4 registers + class token (LKAT) or + class token (ViT)."""
    return (img // 16) ** 2 + (5 if config.model.startswith("lkat") else 1)


def main_configs(sizes: list[str], attn_modes: list[str], compile_modes: list[bool]) -> list[Config]:
    """Rows of the main table: per size and compile setting, ViT and LKAT per GLA mode; the paper config eager."""
    configs = []
    for size in sizes:
        for c in compile_modes:
            configs += [vit(size, c), *(lkat(size, a, c) for a in attn_modes)]
        if False in compile_modes:
            configs.append(paper(size))
    return configs


def add_ratios(rows: list[dict]) -> None:
    """Each row's images/s over the same-size ViT (same compile setting) and over the same-size paper config."""

    def find(model: str, **match) -> dict | None:
        return next(
            (r for r in rows if r["model"] == model and "error" not in r and all(r[k] == v for k, v in match.items())),
            None,
        )

    for r in rows:
        if "error" in r:
            continue
        size = r["model"].split("_")[1]
        refs = {
            "vit": find(f"vit_{size}_patch16_224", compile=r["compile"]),
            "paper": find(f"lkat_{size}_patch16_224", kan="torch", attn="fused_recurrent"),
        }
        for name, ref in refs.items():
            if ref is not None:
                r[f"train_x_{name}"] = r["train_img_s"] / ref["train_img_s"]
                r[f"infer_x_{name}"] = r["infer_img_s"] / ref["infer_img_s"]


def print_main(rows: list[dict]) -> None:
    """The main table as markdown."""
    print(
        "| model | compile | batch | train img/s | train peak GiB | infer img/s | train × ViT | infer × ViT | "
        "train × paper config | GPU | torch | date |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['label']} | {r['compile']} | {r['batch']} | {r['error']} ||||||||")
            continue
        ratios = [f"{r[k]:.2f}×" if k in r else "—" for k in ("train_x_vit", "infer_x_vit", "train_x_paper")]
        print(
            f"| {r['label']} | {r['compile']} | {r['batch']} | {r['train_img_s']:.0f} | {r['train_peak_GiB']:.2f} | "
            f"{r['infer_img_s']:.0f} | {' | '.join(ratios)} | {r['gpu']} | {r['torch']} | {r['date']} |"
        )


def crossover(rows: list[dict], key: str) -> dict | None:
    """Where LKAT's images/s (key) first reaches ViT's: interpolated in log(resolution) between measured sizes."""
    pairs = []
    for img in sorted({r["img_size"] for r in rows}):
        at = {r["model"].split("_")[0]: r for r in rows if r["img_size"] == img and key in r}
        if len(at) == 2:
            pairs.append((img, math.log(at["lkat"][key] / at["vit"][key])))
    for (img0, lr0), (img1, lr1) in zip(pairs, pairs[1:], strict=False):
        if lr0 < 0 <= lr1:
            w = -lr0 / (lr1 - lr0)
            return {"img_size": round(math.exp((1 - w) * math.log(img0) + w * math.log(img1))), "between": [img0, img1]}
    if pairs and pairs[0][1] >= 0:
        return {"img_size": pairs[0][0], "between": [pairs[0][0], pairs[0][0]], "note": "faster at every size"}
    return None


def sweep(args: argparse.Namespace, out: Path) -> dict:
    """LKAT-S (--attn[0]) and ViT-S from 224² up, batch ~ --sweep-tokens / patches; rows and crossovers.

    The JSON at `out` is rewritten after every row, so a run cut short keeps what it measured."""
    result = {"rows": [], "crossover": {}}
    for img in args.sweep_sizes:
        batch = max(1, round(args.sweep_tokens / (img // 16) ** 2))
        for config in (vit("small"), lkat("small", args.attn[0])):
            result["rows"].append({**bench(config, batch, img, args.warmup, args.iters), **environment()})
            result["crossover"] = {k: crossover(result["rows"], f"{k}_img_s") for k in ("train", "infer")}
            out.write_text(json.dumps(result, indent=2))
    return result


def print_sweep(result: dict) -> None:
    """The sweep as markdown."""
    print(
        "| model | img | tokens | batch | train img/s | train peak GiB | GiB / image | infer img/s | infer peak GiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        if "error" in r:
            print(f"| {r['label']} | {r['img_size']} | {r['tokens']} | {r['batch']} | {r['error']} |||||")
            continue
        print(
            f"| {r['label']} | {r['img_size']} | {r['tokens']} | {r['batch']} | {r['train_img_s']:.1f} | "
            f"{r['train_peak_GiB']:.2f} | {r['train_peak_GiB'] / r['batch']:.3f} | {r['infer_img_s']:.1f} | "
            f"{r['infer_peak_GiB']:.2f} |"
        )
    print(f"crossover (LKAT-S reaches ViT-S images/s): {result['crossover']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument(
        "--attn",
        nargs="+",
        default=["chunk", "fused_recurrent", "short"],
        help="LKAT GLA modes (the sweep uses the first)",
    )
    parser.add_argument("--compile", choices=["off", "on", "both"], default="off")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--sweep", action="store_true", help="resolution sweep of LKAT-S and ViT-S instead")
    parser.add_argument("--sweep-sizes", nargs="+", type=int, default=[224, 512, 1024, 1536, 2048])
    parser.add_argument("--sweep-tokens", type=int, default=128 * 196, help="patch tokens per batch in the sweep")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    env = environment()
    name = "bench_model_sweep" if args.sweep else "bench_model"
    out = args.out or RESULTS / f"{name}-{env['gpu'].replace(' ', '_')}-{env['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.sweep:
        print_sweep(sweep(args, out))
        return
    compile_modes = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    rows = []
    for config in main_configs(args.sizes, args.attn, compile_modes):
        rows.append({**bench(config, args.batch, args.img_size, args.warmup, args.iters), **env})
        add_ratios(rows)
        out.write_text(json.dumps(rows, indent=2))  # after every row: a run cut short keeps what it measured
    print_main(rows)


if __name__ == "__main__":
    main()
