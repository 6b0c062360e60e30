"""Where a profiled step's kernel time goes, by part of the model, for the rows of a `bench_model.py --compare` JSON.

    python benchmarks/step_breakdown.py benchmarks/results/bench_model_compare_tiny_vit_matmul_kernels-h200-*.json

Each row's profiled kernels (`train_profile` / `infer_profile`, as many as `--top-kernels` kept) are put in a part by
their names: our Triton kernels by their function names, cuBLAS / cuDNN / SDPA by their library's prefixes, and
inductor's fused kernels (`triton_<kind>_fused_<ops>_<n>`) by the ops fused in them, the first match in PARTS
winning (an inductor kernel that fuses the KAN basis with a layer norm's backward counts as KAN). Prints a markdown
table of kernel ms per part, one column per row, and the share of the step the listed kernels cover.
Results older than the kernels' present names (those of 2026-11-26 included) call the GLA input path's kernels
`_fwd_kernel` / `_bwd_kernel`, as they then called the eager output path's: compiled steps run only the former, so
of those results only compiled rows are broken down.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

PARTS: tuple[tuple[str, str], ...] = (  # (part, regular expression searched in the kernel's name), first match wins
    ("GLA: our short kernels", r"^_gla_short_"),
    ("GLA: states between segments", r"^_(own_states|own_state_grads|scan)_kernel"),
    ("GLA: fla's kernels", r"^(chunk_|fused_recurrent_|chunk_gla)"),
    ("attention: SDPA", r"sdpa|flash|fmha"),
    ("GLA input path (conv, SiLU, RMSNorm, RoPE)", r"^_gla_(input|qkv)_|^_(fwd|bwd)_kernel$"),
    ("GLA output path (LayerNorm x SiLU gate), our kernels", r"^_gated_norm_"),
    ("GLA gate (log-sigmoid, or our kernels with its Linear)", r"log_sigmoid|^_log_gate|^_gla_gate_"),
    ("KAN: our Triton kernels", r"^_(rbf_grid_linear|kan_|edge_)"),
    ("KAN basis, traced (inductor)", r"^triton_.*exp2"),
    ("GELU (inductor)", r"^triton_.*gelu"),
    ("patch embedding convolution (cuDNN)", r"convolve|nchwToNhwc|nhwcToNchw|wgrad|dgrad"),
    ("GEMM (cuBLAS, CUTLASS)", r"nvjet|gemm|cutlass|splitKreduce|xmma"),
    ("layer norms (inductor)", r"^triton_.*layer_norm"),
    ("other inductor kernels (copies, cats, sums)", r"^triton_"),
    ("optimizer (fused AdamW)", r"FusedOptimizer|multi_tensor_apply"),
    ("other (torch reductions, memsets, loss)", r""),
)


def part_of(kernel: str) -> str:
    """The part of PARTS a kernel's name belongs to."""
    return next(part for part, pattern in PARTS if re.search(pattern, kernel))


def breakdown(profile: dict) -> dict[str, float]:
    """Kernel ms per part of one profiled step (parts without kernels left out), in PARTS' order."""
    ms = dict.fromkeys((part for part, _ in PARTS), 0.0)
    for kernel in profile["top_kernels"]:
        ms[part_of(kernel["op"])] += kernel["ms"]
    return {part: t for part, t in ms.items() if t > 0}


def _unrenamed(profile: dict) -> bool:
    """Whether a profile names kernels `_fwd_kernel` / `_bwd_kernel` (the input or the output path: older results)."""
    return any(re.fullmatch(r"_(fwd|bwd)_kernel", kernel["op"]) for kernel in profile["top_kernels"])


def table(rows: list[dict], phase: str) -> str:
    """The markdown table of `phase` ("train" or "infer") over the rows without an error."""
    rows = [r for r in rows if f"{phase}_profile" in r]
    if any(r["compile"] == "eager" and _unrenamed(r[f"{phase}_profile"]) for r in rows):
        raise SystemExit("an older result's eager rows: the input and output paths' kernels share their names there")
    parts = [breakdown(r[f"{phase}_profile"]) for r in rows]  # by position: a label recurs in each compile mode
    names = [part for part, _ in PARTS if any(part in p for p in parts)]
    lines = [f"| {phase} step, kernel ms | " + " | ".join(f"{r['label']} ({r['compile']})" for r in rows) + " |"]
    lines.append("|---" * (len(rows) + 1) + "|")
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{p.get(name, 0.0):.3f}" for p in parts) + " |")
    totals = [r[f"{phase}_profile"]["device_time_ms"] for r in rows]
    listed = [sum(p.values()) for p in parts]
    lines.append("| **all kernels** | " + " | ".join(f"**{t:.3f}**" for t in totals) + " |")
    lines.append(
        "| share in the listed kernels | "
        + " | ".join(f"{s / t:.1%}" for s, t in zip(listed, totals, strict=True))
        + " |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path, help="a bench_model.py --compare JSON")
    parser.add_argument("--phases", nargs="+", default=["train", "infer"], choices=["train", "infer"])
    args = parser.parse_args()
    rows = json.loads(args.result.read_text())
    for phase in args.phases:
        print(table(rows, phase), end="\n\n" if phase != args.phases[-1] else "\n")


if __name__ == "__main__":
    main()
