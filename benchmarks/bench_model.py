"""Time whole models on a GPU: a training step and inference, images/s and peak memory; a resolution sweep.

    python benchmarks/bench_model.py                                # main table at 224², eager
    python benchmarks/bench_model.py --sizes small --attn short chunk --compile on   # compiled rows
    python benchmarks/bench_model.py --sweep                         # LKAT-S vs ViT-S, 224² to 2048²
    python benchmarks/bench_model.py --compare --sizes tiny          # LKAT-T vs ViT-T, eager and compiled, profiled
    python benchmarks/bench_model.py --compare --tiny --device cpu --batch 4 --img-size 16 --attn chunk   # on a CPU

Main table, per size (tiny/small/base): timm's vit_<size>_patch16_224 (SDPA attention), LKAT with each GLA
mode of --attn, and the configuration the paper's code runs (fla's fused_recurrent GLA and the unfused
elementwise RBF op with fp32 output, i.e. KAN backend "torch"; the paper-design Triton RBF kernel is not
in this repository). A training step is forward, backward and a fused AdamW step under bf16 autocast on
synthetic data already on the GPU, with TF32 matmuls where a model keeps fp32 (as the trainer sets them under
autocast; --tf32 off for full fp32 there) and the backward on the calling thread (as the trainer runs it;
--backward-thread device for the autograd engine's device thread); inference is a bf16-autocast forward without
gradients. Each row carries
ratios to the ViT of its size (same compile setting) and to the paper configuration of its size.
The sweep keeps tokens x batch near --sweep-tokens and reports per-image numbers and the crossover
resolution where LKAT-S starts to train (and infer) faster than ViT-S.
--compare (issue 19) measures, per size, ViT and LKAT (each GLA mode of --attn x KAN backend of --kan x mode of GLA's
input path, output path, forget gate and core of --gla-input, --gla-output, --gla-gate, --gla-core) under each
--compile-modes setting
("eager", or a torch.compile mode with fullgraph=True: any graph break fails the row): train and inference
images/s (`*_img_s`: the median step with a synchronisation after each, so the host's time before a step's first
kernel counts; `*_pipelined_img_s`: --iters steps queued back to back between two synchronisations, best of three,
as the trainer runs them; `*_pipelined_busy`: the profiled step's kernel time over the queued step's time;
`*_synchronised_busy`: the same over the median synchronised step's time, since the profiler's own work on the host
lengthens the profiled step itself and its `gpu_busy` understates the busy share of a step run without it), peak
memory per image (over the warm-up steps too, which compile, autotune Triton kernels whose tuning is not cached yet
(--tune-first: an eager step of each LKAT before, so that its tuning stays out) and record CUDA graphs;
`*_steady_peak_MiB_per_image`: the timed steps' alone), and one profiled training step and
inference (profile_step.py: kernel launches, GPU-busy fraction, the share of dtype copies, the top ops), with LKAT's
ratios to ViT (`*_x_vit`, `*_pipelined_x_vit`); --vit-patch-embed timm matmul adds a ViT whose patch embedding is
LKAT's (its convolution one matmul on CUDA) and LKAT's ratios to it (`*_x_vit_matmul`): the architectures alone,
without LKAT's faster patch embedding; --memory-budgets adds compiled
LKAT rows at each activation memory budget (the trainer's --activation-memory-budget). --tiny compares lkat_micro
with a ViT of its size (16², patch 4, 64-d, 4 blocks), so that the mode runs on a CPU in seconds.
A configuration that runs out of memory (or fails) is recorded with its error and skipped.
Writes JSON (benchmarks/results/ unless --out) and prints markdown.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import timm
import torch
from common import dated_result_path, environment, write_result  # benchmarks/ is the script folder
from profile_step import TOP, profile_step

import lkat_lens
from lkat_lens.flat_params import FlatParameters
from lkat_lens.kernels import kan_dispatch
from lkat_lens.models.attention import INPUT_MODES, PATH_MODES
from lkat_lens.models.patch_embed import PatchEmbed
from lkat_lens.recipe import param_groups
from lkat_lens.train_config import replays_cuda_graphs

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
    eager_graphs: bool | None = None  # LKAT.set_backends(eager_graphs=...); None: the model's default


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
        model.set_backends(attn=config.attn, kan=config.kan, eager_graphs=config.eager_graphs)
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
    row = {**asdict(config), "batch": batch, "img_size": img, "tokens": tokens(config, img), **settings()}
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


def settings() -> dict:
    """The process settings a row was measured under: TF32 for fp32 matmuls (--tf32) and the backward's thread
    (--backward-thread)."""
    thread = "device" if torch._C._is_multithreading_enabled() else "caller"
    return {"tf32": torch.backends.cuda.matmul.allow_tf32, "backward_thread": thread}


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
            write_result(out, result)
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


COMPILE_MODES = ("eager", "default", "reduce-overhead", "max-autotune-no-cudagraphs")
TINY_VIT = dict(patch_size=4, embed_dim=64, depth=4, num_heads=2)  # lkat_micro's size


VIT_PATCH_EMBEDS = {"timm": {}, "matmul": {"embed_layer": PatchEmbed}}  # --vit-patch-embed: create kwargs


def compared_models(size: str, tiny: bool, vit_patch_embeds: list[str]) -> list[tuple[str, str, dict, str]]:
    """(label, registry name, create kwargs, patch embedding) of the ViTs, one per patch embedding of
    `vit_patch_embeds` ("timm": timm's as it ships; "matmul": LKAT's, whose convolution runs as one matmul on CUDA),
    then the LKAT compared at a size (its own patch embedding, "matmul")."""
    letter = SIZES[size]
    vit, vit_name, vit_kwargs = (
        ("ViT-micro", "vit_tiny_patch16_224", TINY_VIT) if tiny else (f"ViT-{letter}", f"vit_{size}_patch16_224", {})
    )
    lkat, lkat_name = ("LKAT-micro", "lkat_micro") if tiny else (f"LKAT-{letter}", f"lkat_{size}_patch16_224")
    vits = [
        (vit + ("" if embed == "timm" else " patch matmul"), vit_name, vit_kwargs | VIT_PATCH_EMBEDS[embed], embed)
        for embed in vit_patch_embeds
    ]
    return [*vits, (lkat, lkat_name, {}, "matmul")]


def pipelined_ms(fn, iters: int, device: str, rounds: int = 3) -> float:
    """Milliseconds per call of fn with `iters` calls queued back to back between two synchronisations (the host
    running ahead of the device, as the trainer runs), the best of `rounds` rounds."""
    times = []
    for _ in range(rounds):
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / iters)
        else:
            begin = time.perf_counter()
            for _ in range(iters):
                fn()
            times.append((time.perf_counter() - begin) * 1e3 / iters)
    return min(times)


def wall_ms(fn, iters: int, device: str) -> float:
    """Median milliseconds per call (no warm-up: the caller's): CUDA events on a GPU, perf_counter elsewhere."""
    if device == "cuda":
        return time_ms(fn, 0, iters)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def peak_gib(device: str) -> float | None:
    """Peak allocated GPU memory since the last reset (None on a CPU)."""
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


def reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def tune_kernels(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """One eager training step (its gradients dropped) and one inference of `model` on the row's batch, under bf16
    autocast: our Triton kernels autotune at the row's shapes (the compiled model calls them with the same autotuning
    keys) before the warm-up, whose peak memory the tuning's buffers would otherwise raise (--tune-first)."""
    training = model.training
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        model.train(True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        model.zero_grad(set_to_none=True)
        model.train(False)
        with torch.no_grad():
            model(x)
    model.train(training)


def compare_measure(
    name: str, kwargs: dict, backends: dict, mode: str, budget: float, args: argparse.Namespace
) -> dict:
    """Train/inference speed, peak memory and one profiled step of each, for one model (LKAT: with its GLA and KAN
    backends) and compile mode; a compiled model's saved activations are partitioned under the activation memory
    `budget` (torch._functorch.config.activation_memory_budget: 1.0 inductor's default, lower recomputes more)."""
    with torch._functorch.config.patch(activation_memory_budget=budget):
        return _compare_measure(name, kwargs, backends, mode, args)


@dataclass
class TrainingRun:
    """A model of the --compare rows, its (compiled) callable and its two timed functions on one synthetic batch."""

    model: torch.nn.Module
    x: torch.Tensor  # the images of every step
    train_step: Callable[[], None]  # forward, backward and a fused AdamW step under bf16 autocast
    infer: Callable[[], None]  # a bf16-autocast forward without gradients
    optimizer: torch.optim.Optimizer  # over the model's parameters, or over its flats
    net: torch.nn.Module | None = None  # what the step calls, compiled: the model, or its FlatParameters


def training_run(
    name: str, mode: str, device: str, batch: int, img: int, kwargs=None, backends=None, tune_first=False, flat=False
) -> TrainingRun:
    """timm's ViT or LKAT `name` (with `kwargs`, LKAT's `backends`), eager or torch.compile(mode, fullgraph=True),
    fused AdamW, and a batch of `batch` random images at `img`², as --compare and host_timeline.py time them. With
    `flat` its parameters live in flats per weight-decay group and block (lkat_lens.flat_params), as the trainer
    holds them when it compiles."""
    torch.manual_seed(0)
    graphs = mode != "eager" and replays_cuda_graphs(mode)
    if name.startswith("lkat"):
        model = lkat_lens.create_model(name, num_classes=1000, img_size=img, **(kwargs or {}))
        model.set_backends(**{"cuda_graphs": graphs, **(backends or {})})
    else:
        model = timm.create_model(name, pretrained=False, num_classes=1000, img_size=img, **(kwargs or {}))
    model = model.to(device)
    x = torch.randn(batch, 3, img, img, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    if tune_first and name.startswith("lkat"):
        tune_kernels(model, x, y)
    if flat:
        net = FlatParameters(model, param_groups(model, 0.01))  # 0.01: AdamW's default weight decay
        groups = net.param_groups
    else:
        net, groups = model, [{"params": list(model.parameters())}]
    run = net if mode == "eager" else torch.compile(net, mode=mode, fullgraph=True)
    opt = torch.optim.AdamW(groups, lr=1e-4, fused=device == "cuda")

    def train_step():
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(run(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer():
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
            run(x)

    return TrainingRun(model, x, train_step, infer, opt, net)


def _compare_measure(name: str, kwargs: dict, backends: dict, mode: str, args: argparse.Namespace) -> dict:
    device, batch = args.device, args.batch
    setup = training_run(name, mode, device, batch, args.img_size, kwargs, backends, args.tune_first)
    model = setup.model
    row: dict = {"params_M": sum(p.numel() for p in model.parameters()) / 1e6}
    for phase, fn, train in (("train", setup.train_step, True), ("infer", setup.infer, False)):
        model.train(train)
        reset_peak(device)
        for _ in range(args.warmup):  # compiles, autotunes (unless Triton's cache holds the tuning) and records graphs
            fn()
        warm_up = peak_gib(device)
        reset_peak(device)
        ms = wall_ms(fn, args.iters, device)
        queued = pipelined_ms(fn, args.iters, device)
        steady = peak_gib(device)
        peak = None if steady is None else max(warm_up, steady)
        row |= {f"{phase}_ms": ms, f"{phase}_img_s": batch / ms * 1e3, f"{phase}_peak_GiB": peak}
        row |= {f"{phase}_pipelined_ms": queued, f"{phase}_pipelined_img_s": batch / queued * 1e3}
        row[f"{phase}_peak_MiB_per_image"] = None if peak is None else peak * 1024 / batch
        row[f"{phase}_steady_peak_MiB_per_image"] = None if steady is None else steady * 1024 / batch
        row[f"{phase}_profile"] = profile = profile_step(fn, device, args.top_kernels)
        if device == "cuda":  # the GPU's share of a queued step: its kernel time over the queued step's time
            row[f"{phase}_pipelined_busy"] = profile["device_time_ms"] / queued
            row[f"{phase}_synchronised_busy"] = profile["device_time_ms"] / ms
    return row


RATIO_REFERENCES = (  # (suffix of the ratio keys, the ViT's compile mode (None: the LKAT row's), its patch embedding)
    ("vit", None, "timm"),
    ("vit_eager", "eager", "timm"),
    ("vit_matmul", None, "matmul"),
)


def compare_ratios(rows: list[dict]) -> None:
    """Each LKAT row over the ViT of its size: timm's ViT in the same compile mode (`*_x_vit`) and eager
    (`*_x_vit_eager`), and the ViT with LKAT's patch matmul in the same mode (`*_x_vit_matmul`)."""
    for r in rows:
        if "error" in r or not r["model"].startswith("lkat"):
            continue
        for suffix, ref_mode, embed in RATIO_REFERENCES:
            ref = next(
                (
                    v
                    for v in rows
                    if v.get("pair") == r["pair"]
                    and v["compile"] == (ref_mode or r["compile"])
                    and v.get("patch_embed", "timm") == embed
                    and "error" not in v
                    and v["model"].startswith("vit")
                ),
                None,
            )
            if ref is None:
                continue
            for phase in ("train", "infer"):
                r[f"{phase}_x_{suffix}"] = r[f"{phase}_img_s"] / ref[f"{phase}_img_s"]
                if f"{phase}_pipelined_img_s" in r and f"{phase}_pipelined_img_s" in ref:
                    r[f"{phase}_pipelined_x_{suffix}"] = r[f"{phase}_pipelined_img_s"] / ref[f"{phase}_pipelined_img_s"]
            if suffix == "vit":
                mine, theirs = r["train_profile"], ref["train_profile"]
                if mine["device_kernels"] is not None:
                    r["train_kernels_x_vit"] = mine["device_kernels"] / max(theirs["device_kernels"], 1)
                if r["train_peak_GiB"] is not None:
                    r["train_memory_x_vit"] = r["train_peak_GiB"] / ref["train_peak_GiB"]
                    steady = "train_steady_peak_MiB_per_image"
                    r["train_steady_memory_x_vit"] = r[steady] / ref[steady]


# LKAT's paths around the GLA that --compare varies: set_backends keyword (its argparse dest) -> label word
GLA_PATHS = {"gla_input": "inputs", "gla_output": "output", "gla_gate": "gate", "gla_core": "core"}


def compared_variants(size: str, args: argparse.Namespace) -> list[tuple[str, str, dict, dict, float, str]]:
    """(label, registry name, create kwargs, backends, activation memory budget, patch embedding): the ViTs
    (inductor's default budget), then LKAT with every combination of --attn, --kan, --gla-input, --gla-output,
    --gla-gate, --gla-core and --memory-budgets."""
    rows = []
    for label, name, kwargs, embed in compared_models(size, args.tiny, args.vit_patch_embed):
        if not name.startswith("lkat"):
            rows.append((label, name, kwargs, {}, 1.0, embed))
            continue
        path_modes = [getattr(args, path) for path in GLA_PATHS]
        for attn, kan, *modes in itertools.product(args.attn, args.kan, *path_modes):
            paths = dict(zip(GLA_PATHS, modes, strict=True))
            for budget in args.memory_budgets:
                suffix = "" if budget == 1.0 else f" budget {budget:g}"
                suffix += "".join(f" {mode} {GLA_PATHS[path]}" for path, mode in paths.items() if mode != "auto")
                backends = {"attn": attn, "kan": kan, **paths}
                rows.append((f"{label} {attn}/{kan}{suffix}", name, kwargs, backends, budget, embed))
    return rows


def compare(args: argparse.Namespace, out: Path) -> list[dict]:
    """The --compare rows; the JSON at `out` is rewritten after every row."""
    rows: list[dict] = []
    for size in args.sizes[:1] if args.tiny else args.sizes:
        for mode in args.compile_modes:  # modes outside: a run cut short keeps both models of the first modes
            for label, name, kwargs, backends, budget, embed in compared_variants(size, args):
                row = {"label": label, "model": name, "pair": size, "compile": mode, "patch_embed": embed}
                row |= {k: backends.get(k) for k in ("attn", "kan", *GLA_PATHS)}
                row |= {"activation_memory_budget": budget}
                row |= {"batch": args.batch, "img_size": args.img_size, "device": args.device, **settings()}
                start = time.perf_counter()
                kan_dispatch.clear_choices()  # each row measures its own KAN paths (kan="auto")
                try:
                    row |= compare_measure(name, kwargs, backends, mode, budget, args)
                    row["kan_choices"] = {repr(key): path for key, path in kan_dispatch.cached_choices().items()}
                except Exception as error:  # record it and go on with the other rows
                    row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
                finally:
                    gc.collect()
                    torch.compiler.reset()
                    if args.device == "cuda":
                        torch.cuda.empty_cache()
                row["seconds"] = time.perf_counter() - start
                rows.append({**row, **environment()})
                compare_ratios(rows)
                write_result(out, rows)
                print(f"{label} {mode}: {row.get('error') or _summary(row)}", flush=True)
    return rows


def _summary(row: dict) -> str:
    prof = row["train_profile"]
    busy = ""
    if prof["gpu_busy"] is not None:
        busy = (
            f", {prof['device_kernels']} kernels, GPU busy {row['train_synchronised_busy']:.0%} of a synchronised step "
            f"({prof['gpu_busy']:.0%} of the profiled one)"
        )
    return (
        f"train {row['train_img_s']:.4g} img/s ({row['train_pipelined_img_s']:.4g} queued), infer "
        f"{row['infer_img_s']:.4g} img/s ({row['infer_pipelined_img_s']:.4g} queued){busy}, "
        f"copies {prof['copy_share']:.1%} of the step's device time"
    )


def print_compare(rows: list[dict]) -> None:
    """The --compare table as markdown."""
    print(
        "| model | compile | train img/s | infer img/s | train × ViT | infer × ViT | train × ViT eager "
        "| queued train × ViT | queued infer × ViT | queued train × ViT patch matmul | queued infer × ViT patch matmul "
        "| kernels / step | launch calls | GPU busy, synchronised (profiled) | copy share | MiB / image (train) | GPU |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['label']} | {r['compile']} | {r['error']} |||||||||||||||")
            continue
        p = r["train_profile"]
        ratios = (
            "train_x_vit",
            "infer_x_vit",
            "train_x_vit_eager",
            "train_pipelined_x_vit",
            "infer_pipelined_x_vit",
            "train_pipelined_x_vit_matmul",
            "infer_pipelined_x_vit_matmul",
        )
        cells = [f"{r[k]:.2f}×" if k in r else "—" for k in ratios]
        busy = "—" if p["gpu_busy"] is None else f"{r['train_synchronised_busy']:.0%} ({p['gpu_busy']:.0%})"
        mem = "—" if r["train_peak_MiB_per_image"] is None else f"{r['train_peak_MiB_per_image']:.1f}"
        speed = f"{r['train_img_s']:.4g} | {r['infer_img_s']:.4g} | {' | '.join(cells)}"
        work = f"{p['device_kernels'] or '—'} | {p['launch_calls'] or '—'} | {busy} | {p['copy_share']:.1%}"
        print(f"| {r['label']} | {r['compile']} | {speed} | {work} | {mem} | {r['gpu']} |")


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
    parser.add_argument("--compare", action="store_true", help="LKAT vs ViT, eager and compiled, profiled (issue 19)")
    parser.add_argument(
        "--kan", nargs="+", default=["auto"], help="--compare: LKAT's KAN backends (auto: 'traced' when compiled)"
    )
    for path, word in GLA_PATHS.items():
        parser.add_argument(
            f"--{path.replace('_', '-')}",
            nargs="+",
            default=["auto"],
            choices=INPUT_MODES,
            help=f"--compare: modes of LKAT's GLA {word} (VisionGLA.{PATH_MODES[path]}; auto: our kernels on CUDA, "
            "eager and compiled; torch: the modules)",
        )
    parser.add_argument("--compile-modes", nargs="+", default=["eager", "default"], choices=COMPILE_MODES)
    parser.add_argument(
        "--vit-patch-embed",
        nargs="+",
        default=["timm"],
        choices=list(VIT_PATCH_EMBEDS),
        help="--compare: the ViTs' patch embeddings (timm: as timm ships it, a cuDNN convolution; matmul: LKAT's, one "
        "matmul on CUDA as in LKAT, so that the ratio is the architectures' alone)",
    )
    parser.add_argument("--tiny", action="store_true", help="--compare lkat_micro with a ViT of its size")
    parser.add_argument(
        "--memory-budgets",
        nargs="+",
        type=float,
        default=[1.0],
        help="--compare: compiled LKAT rows at each activation memory budget (1.0: inductor's default; lower "
        "recomputes cheap activations in the backward instead of saving them)",
    )
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="--compare only")
    parser.add_argument(
        "--tf32",
        choices=["on", "off"],
        default="on",
        help="TF32 for fp32 matmuls and convolutions (on: as the trainer sets them under bf16 autocast; LKAT's "
        "gate projection runs in fp32)",
    )
    parser.add_argument(
        "--backward-thread",
        choices=["caller", "device"],
        default="caller",
        help="where autograd runs the backward: the calling thread (as the trainer) or the engine's device thread",
    )
    parser.add_argument(
        "--top-kernels",
        type=int,
        default=TOP,
        help=f"--compare: how many of the profiled step's kernels and ops to record, by device time (default {TOP})",
    )
    parser.add_argument(
        "--tune-first",
        action="store_true",
        help="--compare: one eager training step and inference of each LKAT before its warm-up, so that our Triton "
        "kernels' autotuning (when not cached) stays out of the warm-up's peak memory",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32 == "on"
    torch.autograd.set_multithreading_enabled(args.backward_thread == "device")
    env = environment()
    name = "bench_model_sweep" if args.sweep else "bench_model_compare" if args.compare else "bench_model"
    out = args.out or dated_result_path(name, env)
    if args.compare:
        print_compare(compare(args, out))
        return
    if args.sweep:
        print_sweep(sweep(args, out))
        return
    compile_modes = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    rows = []
    for config in main_configs(args.sizes, args.attn, compile_modes):
        rows.append({**bench(config, args.batch, args.img_size, args.warmup, args.iters), **env})
        add_ratios(rows)
        write_result(out, rows)  # after every row: a run cut short keeps what it measured
    print_main(rows)


if __name__ == "__main__":
    main()
