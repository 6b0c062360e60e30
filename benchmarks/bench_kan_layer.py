"""Time the fused RBF-KAN layer (basis inside the matmul) against the unfused paths and plain layers on a GPU.

    python benchmarks/bench_kan_layer.py --tokens 12608 --dim 768 --hidden 3072

Both layer shapes of a block's MLP (fc1: dim -> hidden, fc2: hidden -> dim), bf16, one forward+backward
into x and every weight. Shared basis (G = --shared-grid): the fused kernels, the elementwise Triton
kernel + cuBLAS, the torch path and what backend "auto" picks, against nn.Linear + GELU of the same
shape; and, each under torch.compile, the "traced" path and the fused kernels (as custom ops) against
nn.Linear + GELU and against GELU + nn.Linear (the activation on the layer's input, where the KAN's acts: for fc2 the
hidden width). Then the whole MLP under torch.compile: LKAT's two KAN layers (traced) against ViT's Linear + GELU +
Linear (timm's Mlp) at the same widths. Edge basis (G = --edge-grid): the fused kernels and FastKAN's torch
computation (basis materialised, then the matmul), against one cuBLAS GEMM with K = in*G on a ready [tokens, in*G]
input.
Each row: median time (called from Python, the host's dispatch included), the GPU's own time (the summed
durations of the kernels of one forward+backward under torch.profiler, gradients starting empty as in a
training step: what a model trained under CUDA graphs pays), peak extra memory, and the largest tensor saved
for backward other than the weights, next to x's size.
Writes JSON (--out) and prints markdown tables.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from common import dated_result_path, environment, write_result  # benchmarks/ is the script folder
from profile_step import profile_step
from triton.testing import do_bench

from lkat_lens.kernels import kan_dispatch
from lkat_lens.kernels.kan_linear import TRACED, edge_kan_linear, kan_linear

GRID = (-2.0, 2.0)
MiB = 2**20
TIMING = {"warmup": 10, "rep": 50, "return_mode": "median"}  # ms of warm-up and of timed repeats


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def largest_saved_activation(fn: Callable[[], torch.Tensor], weights: list[torch.Tensor]) -> int:
    """Bytes of the largest tensor that one forward of fn saves for backward, weights excluded."""
    weight_ptrs = {w.data_ptr() for w in weights}
    sizes = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in weight_ptrs:
            sizes.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return max(sizes)


def measure(name: str, fn: Callable[[], torch.Tensor], leaves: list[torch.Tensor], weights: list[torch.Tensor]) -> dict:
    """Median ms, kernel ms (the GPU's time: one profiled call) and peak extra MiB of forward+backward of fn, and
    its largest saved activation."""
    dy = torch.randn_like(fn())

    def step() -> None:
        fn().backward(dy)

    step()  # compile, autotune and let backend auto measure first
    ms = do_bench(step, grad_to_none=leaves, **TIMING)
    for t in leaves:  # a training step's gradients start empty: no accumulation kernels in the profile
        t.grad = None
    kernels = profile_step(step, "cuda")
    for t in leaves:
        t.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / MiB
    return {
        "path": name,
        "ms": ms,
        "kernel_ms": kernels["device_time_ms"],
        "kernels": kernels["device_kernels"],
        "top_kernels": kernels["top_kernels"],
        "peak_MiB": peak,
        "saved_max_MiB": largest_saved_activation(fn, weights) / MiB,
    }


def compile_static(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """fn compiled whole for static shapes, as in a compiled model: a second layer shape would otherwise be compiled for
    dynamic shapes (inductor then wrote the traced fc2 backward as a looped reduction, 0.093 against 0.049 ms)."""
    return torch.compile(fn, fullgraph=True, dynamic=False)


def leaf(*shape: int, dtype: torch.dtype = torch.bfloat16, scale: float = 1.0) -> torch.Tensor:
    """A random CUDA tensor that requires grad."""
    return (scale * torch.randn(*shape, device="cuda")).to(dtype).requires_grad_()


def bench_shared(tokens: int, K: int, N: int, G: int) -> list[dict]:
    """Shared-basis layer on every path, and nn.Linear + GELU of the same shape."""
    x, gw, W = leaf(tokens, K, scale=1.5), leaf(1, G, dtype=torch.float32), leaf(N, K, scale=K**-0.5)
    lin_w, lin_b = leaf(N, K, scale=K**-0.5), leaf(N)
    rows = [
        measure(path, lambda p=path: kan_linear(x, gw, W, *GRID, backend=p), [x, gw, W], [gw, W])
        for path in ("fused", "triton", "torch", "auto")
    ]
    rows[-1]["chose"] = [v for k, v in kan_dispatch.cached_choices().items() if k[:4] == ("kan", tokens, K, N)]
    rows.append(measure("linear+gelu", lambda: F.gelu(F.linear(x, lin_w, lin_b)), [x, lin_w, lin_b], [lin_w, lin_b]))
    compiled_kan = compile_static(lambda: kan_linear(x, gw, W, *GRID, backend=TRACED))
    compiled_fused = compile_static(lambda: kan_linear(x, gw, W, *GRID, backend="fused"))
    compiled_mlp = compile_static(lambda: F.gelu(F.linear(x, lin_w, lin_b)))
    compiled_gelu_first = compile_static(lambda: F.linear(F.gelu(x), lin_w, lin_b))
    rows.append(measure("traced, compiled", compiled_kan, [x, gw, W], [gw, W]))
    rows.append(measure("fused, compiled", compiled_fused, [x, gw, W], [gw, W]))
    rows.append(measure("linear+gelu, compiled", compiled_mlp, [x, lin_w, lin_b], [lin_w, lin_b]))
    rows.append(measure("gelu+linear, compiled", compiled_gelu_first, [x, lin_w, lin_b], [lin_w, lin_b]))
    return [{"basis": "shared", "G": G, "K": K, "N": N, "x_MiB": x.nbytes / MiB, **r} for r in rows]


def bench_mlp(tokens: int, dim: int, hidden: int, G: int) -> list[dict]:
    """The whole MLP under torch.compile: LKAT's two shared-basis KAN layers on the traced path against ViT's Linear +
    GELU + Linear with biases (timm's Mlp)."""
    x = leaf(tokens, dim, scale=1.5)
    gw1, W1 = leaf(1, G, dtype=torch.float32), leaf(hidden, dim, scale=dim**-0.5)
    gw2, W2 = leaf(1, G, dtype=torch.float32), leaf(dim, hidden, scale=hidden**-0.5)
    w1, b1, w2, b2 = leaf(hidden, dim, scale=dim**-0.5), leaf(hidden), leaf(dim, hidden, scale=hidden**-0.5), leaf(dim)

    def kan() -> torch.Tensor:
        return kan_linear(kan_linear(x, gw1, W1, *GRID, backend=TRACED), gw2, W2, *GRID, backend=TRACED)

    def vit() -> torch.Tensor:
        return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)

    rows = [
        measure("kan mlp traced, compiled", compile_static(kan), [x, gw1, W1, gw2, W2], [gw1, W1, gw2, W2]),
        measure("vit mlp, compiled", compile_static(vit), [x, w1, b1, w2, b2], [w1, b1, w2, b2]),
    ]
    return [{"basis": "shared", "G": G, "K": dim, "N": dim, "x_MiB": x.nbytes / MiB, **r} for r in rows]


def bench_edge(tokens: int, K: int, N: int, G: int) -> list[dict]:
    """Edge-basis layer fused and on FastKAN's torch path, and a cuBLAS GEMM with K*G inputs."""
    x, W = leaf(tokens, K, scale=1.5), leaf(N, K * G, scale=(K * G) ** -0.5)
    basis = leaf(tokens, K * G)
    rows = [
        measure(name, lambda p=path: edge_kan_linear(x, W, *GRID, G, backend=p), [x, W], [W])
        for name, path in (("fused", "fused"), ("fastkan-torch", "torch"), ("auto", "auto"))
    ]
    rows[-1]["chose"] = [v for k, v in kan_dispatch.cached_choices().items() if k[:4] == ("edge", tokens, K, N)]
    rows.append(measure("gemm K*G", lambda: F.linear(basis, W), [basis, W], [W]))
    return [{"basis": "edge", "G": G, "K": K, "N": N, "x_MiB": x.nbytes / MiB, **r} for r in rows]


def ratios(rows: list[dict]) -> dict[str, float]:
    """The issue's comparisons for one layer shape."""
    t = {(r["basis"], r["path"]): r["ms"] for r in rows}
    gpu = {(r["basis"], r["path"]): r["kernel_ms"] for r in rows}
    return {
        "shared traced / linear+gelu, both compiled, kernel time": (
            gpu["shared", "traced, compiled"] / gpu["shared", "linear+gelu, compiled"]
        ),
        "shared traced / gelu+linear, both compiled, kernel time": (
            gpu["shared", "traced, compiled"] / gpu["shared", "gelu+linear, compiled"]
        ),
        "shared fused / linear+gelu, both compiled, kernel time": (
            gpu["shared", "fused, compiled"] / gpu["shared", "linear+gelu, compiled"]
        ),
        "shared fused / linear+gelu, kernel time": gpu["shared", "fused"] / gpu["shared", "linear+gelu"],
        "shared auto / linear+gelu, kernel time": gpu["shared", "auto"] / gpu["shared", "linear+gelu"],
        "shared fused / linear+gelu": t["shared", "fused"] / t["shared", "linear+gelu"],
        "shared auto / linear+gelu": t["shared", "auto"] / t["shared", "linear+gelu"],
        "shared traced / linear+gelu, both compiled": (
            t["shared", "traced, compiled"] / t["shared", "linear+gelu, compiled"]
        ),
        "torch / shared fused": t["shared", "torch"] / t["shared", "fused"],
        "edge fused / gemm K*G": t["edge", "fused"] / t["edge", "gemm K*G"],
        "fastkan-torch / edge fused": t["edge", "fastkan-torch"] / t["edge", "fused"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=12608, help="rows of x (default: batch 64 x 197 tokens)")
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--hidden", type=int, default=3072)
    parser.add_argument("--shared-grid", type=int, default=4, help="LKAT's default G")
    parser.add_argument("--edge-grid", type=int, default=8, help="FastKAN's default G")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    env = environment()
    results = []
    for layer, (K, N) in (("fc1", (args.dim, args.hidden)), ("fc2", (args.hidden, args.dim))):
        rows = bench_shared(args.tokens, K, N, args.shared_grid) + bench_edge(args.tokens, K, N, args.edge_grid)
        results.append({"layer": layer, "tokens": args.tokens, "rows": rows, "ratios": ratios(rows), **env})
    rows = bench_mlp(args.tokens, args.dim, args.hidden, args.shared_grid)
    kernel_ms = [r["kernel_ms"] for r in rows]
    mlp_ratio = {"kan mlp / vit mlp, both compiled, kernel time": kernel_ms[0] / kernel_ms[1]}
    results.append({"layer": "mlp", "tokens": args.tokens, "rows": rows, "ratios": mlp_ratio, **env})
    write_result(args.out or dated_result_path("bench_kan_layer", env), results)
    print(f"\nbf16, x = [{args.tokens}, in], forward+backward")
    stamp = [env["gpu"], env["torch"], env["triton"], env["date"]]
    header = ["layer", "basis", "G", "in -> out", "path", "ms", "kernel ms", "kernels", "peak MiB"]
    header += ["largest saved activation MiB", "x MiB"]
    rows = [
        [res["layer"], r["basis"], str(r["G"]), f"{r['K']} -> {r['N']}"]
        + [r["path"] + (f" ({', '.join(r['chose'])})" if r.get("chose") else "")]
        + [f"{r['ms']:.3f}", f"{r['kernel_ms']:.3f}", str(r["kernels"]), f"{r['peak_MiB']:.0f}"]
        + [f"{r['saved_max_MiB']:.1f}", f"{r['x_MiB']:.1f}"]
        + stamp
        for res in results
        for r in res["rows"]
    ]
    print(markdown(header + ["GPU", "torch", "triton", "date"], rows))
    print()
    names = list(results[0]["ratios"])
    layers = [res for res in results if res["layer"] != "mlp"]
    print(markdown(["layer", *names], [[res["layer"]] + [f"{res['ratios'][n]:.2f}×" for n in names] for res in layers]))
    print()
    print(markdown(["whole MLP", "ratio"], [[name, f"{value:.2f}×"] for name, value in results[-1]["ratios"].items()]))


if __name__ == "__main__":
    main()
