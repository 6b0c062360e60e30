"""Time forward+backward of the fused Triton RBF grid-linear op against the unfused torch reference on a GPU.

    python benchmarks/bench_rbf.py --tokens 12608 --dims 128 256 512 1024 2048 4096 --grids 4 8 16

x is [tokens, D]; the torch baseline materialises the [tokens, D, G] basis (fp32) and lets autograd
differentiate it. Writes benchmarks/results/bench_rbf-<gpu>-<date>.json and prints a markdown table
(time and peak extra memory of one forward+backward, and the ratios torch / Triton).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
from common import environment  # benchmarks/ is the script folder
from lkat_lens.kernels.rbf import rbf_grid_linear, rbf_grid_linear_reference
from triton.testing import do_bench

RESULTS = Path(__file__).parent / "results"
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
Op = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def fwd_bwd(op: Op, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor) -> Callable[[], None]:
    """One forward+backward of op as a closure."""

    def step() -> None:
        op(x, w).backward(dy)

    return step


def peak_extra_bytes(step: Callable[[], None], x: torch.Tensor, w: torch.Tensor) -> int:
    """Peak bytes allocated by one call of step beyond what was live before it."""
    x.grad = w.grad = None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def bench_one(form: str, tokens: int, D: int, G: int, dtype: torch.dtype) -> dict:
    """Median time and peak memory of one forward+backward, Triton vs torch."""
    x = torch.randn(tokens, D, device="cuda").mul_(1.5).to(dtype).requires_grad_()
    w = torch.randn(1 if form == "shared" else D, G, device="cuda", requires_grad=True)
    dy = torch.randn(tokens, D, device="cuda").to(dtype)
    ops: dict[str, Op] = {
        "triton": lambda a, b: rbf_grid_linear(a, b, -2.0, 2.0, backend="triton"),
        "torch": lambda a, b: rbf_grid_linear_reference(a, b, -2.0, 2.0),
    }
    row: dict = {"form": form, "tokens": tokens, "D": D, "G": G, "dtype": str(dtype).removeprefix("torch.")}
    for name, op in ops.items():
        step = fwd_bwd(op, x, w, dy)
        step()  # compile and autotune first
        row[f"{name}_ms"] = do_bench(step, grad_to_none=[x, w], return_mode="median")
        row[f"{name}_peak_MiB"] = peak_extra_bytes(step, x, w) / 2**20
    row["speedup"] = row["torch_ms"] / row["triton_ms"]
    row["mem_ratio"] = row["torch_peak_MiB"] / row["triton_peak_MiB"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=12608, help="rows of x (default: batch 64 x 197 tokens)")
    parser.add_argument("--dims", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    parser.add_argument("--grids", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--forms", nargs="+", choices=["shared", "channel"], default=["shared", "channel"])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    env = environment()
    rows = [
        {**bench_one(form, args.tokens, D, G, DTYPES[args.dtype]), **env}
        for form in args.forms
        for G in args.grids
        for D in args.dims
    ]
    out = args.out or RESULTS / f"bench_rbf-{env['gpu'].replace(' ', '_')}-{env['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    print(f"{env['gpu']}, torch {env['torch']}, triton {env['triton']}, {env['date']}, {args.dtype}, "
          f"{args.tokens} tokens")
    print("| form | D | G | torch ms | Triton ms | speedup | torch peak MiB | Triton peak MiB | memory ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['form']} | {r['D']} | {r['G']} | {r['torch_ms']:.3f} | {r['triton_ms']:.3f} | {r['speedup']:.1f}x | "
            f"{r['torch_peak_MiB']:.0f} | {r['triton_peak_MiB']:.0f} | {r['mem_ratio']:.1f}x |"
        )


if __name__ == "__main__":
    main()
