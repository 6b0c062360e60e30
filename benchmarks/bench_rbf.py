"""Time the fused Triton RBF grid-linear op against the unfused torch code and the paper's kernel design on a GPU.

    python benchmarks/bench_rbf.py --tokens 12608 --dims 128 256 512 1024 2048 4096 --grids 4 8 16

Sweep (the paper's two kernel figures): x is [tokens, D]; one forward+backward of the Triton op, of the
unfused torch reference (it materialises the [tokens, D, G] basis and autograd differentiates it) and,
for the shared form, of the paper's kernel design (benchmarks/paper_rbf_kernel.py: fp32 output, one
exponential per center, one atomic per program per grid point): time, peak extra memory and the
ratios. Bandwidth: forward and backward of the Triton kernels alone at >= 1e8 elements, as a fraction
of the measured device-to-device copy bandwidth (bytes moved: forward reads x and writes y, backward
reads x and dy and writes dx). Writes JSON (--out) and prints markdown tables.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
from common import dated_result_path, environment, write_result  # benchmarks/ is the script folder
from paper_rbf_kernel import paper_rbf_grid_linear
from triton.testing import do_bench

from lkat_lens.kernels import rbf_triton
from lkat_lens.kernels.rbf import rbf_grid_linear, rbf_grid_linear_reference

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
GRID = (-2.0, 2.0)
TIMING = {"warmup": 10, "rep": 50, "return_mode": "median"}  # ms of warm-up and of timed repeats
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
    """Median time and peak memory of one forward+backward: Triton, torch and (shared form) the paper's design."""
    x = torch.randn(tokens, D, device="cuda").mul_(1.5).to(dtype).requires_grad_()
    w = torch.randn(1 if form == "shared" else D, G, device="cuda", requires_grad=True)
    dy = torch.randn(tokens, D, device="cuda").to(dtype)
    ops: dict[str, Op] = {
        "triton": lambda a, b: rbf_grid_linear(a, b, *GRID, backend="triton"),
        "torch": lambda a, b: rbf_grid_linear_reference(a, b, *GRID),
    }
    if form == "shared":
        ops["paper"] = lambda a, b: paper_rbf_grid_linear(a, b, *GRID)
    row: dict = {"form": form, "tokens": tokens, "D": D, "G": G, "dtype": str(dtype).removeprefix("torch.")}
    for name, op in ops.items():
        step = fwd_bwd(op, x, w, dy)
        step()  # compile and autotune first
        row[f"{name}_ms"] = do_bench(step, grad_to_none=[x, w], **TIMING)
        row[f"{name}_peak_MiB"] = peak_extra_bytes(step, x, w) / 2**20
    row["speedup"] = row["torch_ms"] / row["triton_ms"]
    row["mem_ratio"] = row["torch_peak_MiB"] / row["triton_peak_MiB"]
    if "paper_ms" in row:
        row["vs_paper"] = row["paper_ms"] / row["triton_ms"]
    return row


def copy_bandwidth(numel: int = 1 << 28) -> float:
    """Device-to-device copy bandwidth in GB/s (read + write of a bf16 tensor of numel elements)."""
    src = torch.randn(numel, device="cuda").to(torch.bfloat16)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), **TIMING)
    return 2 * src.nbytes / ms / 1e6


def bandwidth_row(form: str, G: int, numel: int, copy_gbps: float) -> dict:
    """Forward and backward kernel times at numel bf16 elements and their fraction of the copy bandwidth."""
    D = 1 if form == "shared" else 1024
    rows = -(-numel // D)
    x = torch.randn(rows, D, device="cuda").mul_(1.5).to(torch.bfloat16)
    dy = torch.randn(rows, D, device="cuda").to(torch.bfloat16)
    w = torch.randn(D, G, device="cuda") if form == "channel" else torch.randn(1, G, device="cuda")
    fwd_ms = do_bench(lambda: rbf_triton.rbf_grid_linear_fwd(x, w, *GRID), **TIMING)
    bwd_ms = do_bench(lambda: rbf_triton.rbf_grid_linear_bwd(x, w, dy, *GRID), **TIMING)
    fwd_gbps, bwd_gbps = 2 * x.nbytes / fwd_ms / 1e6, 3 * x.nbytes / bwd_ms / 1e6
    row = {"form": form, "G": G, "elements": x.numel(), "D": D, "copy_GBps": copy_gbps}
    row |= {"fwd_ms": fwd_ms, "fwd_GBps": fwd_gbps, "fwd_frac": fwd_gbps / copy_gbps}
    row |= {"bwd_ms": bwd_ms, "bwd_GBps": bwd_gbps, "bwd_frac": bwd_gbps / copy_gbps}
    if form == "shared":
        xg, wg = x.reshape(-1).detach().requires_grad_(), w.clone().requires_grad_()
        for name, op in (("paper", paper_rbf_grid_linear), ("triton", rbf_grid_linear)):
            step = fwd_bwd(lambda a, b, op=op: op(a, b, *GRID), xg, wg, dy.reshape(-1))
            step()  # compile and autotune first
            row[f"{name}_fwd_bwd_ms"] = do_bench(step, grad_to_none=[xg, wg], **TIMING)
        row["vs_paper"] = row["paper_fwd_bwd_ms"] / row["triton_fwd_bwd_ms"]
    return row


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def print_tables(sweep: list[dict], bandwidth: list[dict], env: dict, args: argparse.Namespace) -> None:
    """Markdown tables of both parts, each row stamped with the GPU, versions and date."""
    stamp = [env["gpu"], env["torch"], env["triton"], env["date"]]
    stamp_cols = ["GPU", "torch", "triton", "date"]
    print(f"\nSweep: {args.dtype}, x = [{args.tokens}, D], forward+backward")
    header = ["form", "D", "G", "Triton ms", "torch ms", "speed-up", "peak-memory ratio", "paper-design ms", "vs paper"]
    rows = [
        [r["form"], str(r["D"]), str(r["G"]), f"{r['triton_ms']:.3f}", f"{r['torch_ms']:.3f}", f"{r['speedup']:.1f}×"]
        + [f"{r['mem_ratio']:.1f}×"]
        + ([f"{r['paper_ms']:.3f}", f"{r['vs_paper']:.2f}×"] if "paper_ms" in r else ["—", "—"])
        + stamp
        for r in sweep
    ]
    print(markdown(header + stamp_cols, rows))
    if not bandwidth:
        return
    print(f"\nBandwidth: bf16, kernels alone, copy bandwidth {bandwidth[0]['copy_GBps']:.0f} GB/s")
    header = ["form", "G", "elements", "fwd ms", "fwd GB/s", "fwd / copy", "bwd ms", "bwd GB/s", "bwd / copy"]
    rows = [
        [r["form"], str(r["G"]), f"{r['elements']:.2e}", f"{r['fwd_ms']:.3f}", f"{r['fwd_GBps']:.0f}"]
        + [f"{r['fwd_frac']:.0%}", f"{r['bwd_ms']:.3f}", f"{r['bwd_GBps']:.0f}", f"{r['bwd_frac']:.0%}"]
        + [f"{r['vs_paper']:.2f}×" if "vs_paper" in r else "—"]
        + stamp
        for r in bandwidth
    ]
    print(markdown(header + ["vs paper (fwd+bwd)"] + stamp_cols, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=12608, help="rows of x (default: batch 64 x 197 tokens)")
    parser.add_argument("--dims", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    parser.add_argument("--grids", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--forms", nargs="+", choices=["shared", "channel"], default=["shared", "channel"])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--bandwidth-elements", type=int, default=100_000_000, help="0 skips the bandwidth part")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    env = environment()
    sweep = [
        {**bench_one(form, args.tokens, D, G, DTYPES[args.dtype]), **env}
        for form in args.forms
        for G in args.grids
        for D in args.dims
    ]
    bandwidth = []
    if args.bandwidth_elements:
        copy_gbps = copy_bandwidth()
        bandwidth = [
            {**bandwidth_row(form, G, args.bandwidth_elements, copy_gbps), **env}
            for form in args.forms
            for G in args.grids
        ]
    write_result(args.out or dated_result_path("bench_rbf", env), {"sweep": sweep, "bandwidth": bandwidth})
    print_tables(sweep, bandwidth, env, args)


if __name__ == "__main__":
    main()
