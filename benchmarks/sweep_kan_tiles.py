"""Time every candidate tile of the fused shared-basis KAN kernels at a layer's shape, then the layer with the winners.

    python benchmarks/sweep_kan_tiles.py --tokens 25728 --dim 192 --hidden 768

`kernels/kan_triton.py` autotunes its forward (`kan_fwd`) and its backward (`kan_dx`: dx, the grid weights' gradient
and psi for cuBLAS's dW) over a few tiles (`kan_triton.TILES`). This script widens those candidates to a grid of
(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) whose accumulator and basis tiles fit in registers, runs the fused layer's
forward and backward once at fc2 (hidden -> dim) and fc1 (dim -> hidden), bf16, and records the time Triton's
autotuner measured for every candidate (its median; inf where a tile does not fit). It then checks the layer with the
winners against the fp64 reference and times it beside the other paths and nn.Linear + GELU, eager and compiled
(`bench_kan_layer.bench_shared`, kernel time). Writes JSON (--out) and prints each kernel's fastest tiles.
"""

from __future__ import annotations

import os

os.environ["TRITON_CACHE_AUTOTUNING"] = "0"  # every candidate is timed here, none read from the cache

import argparse  # noqa: E402
import itertools  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from bench_kan_layer import GRID, bench_shared, markdown  # noqa: E402
from common import dated_result_path, environment, write_result  # noqa: E402

from lkat_lens.kernels import kan_triton  # noqa: E402
from lkat_lens.kernels.kan_linear import kan_linear, kan_linear_reference  # noqa: E402

KERNELS = ("kan_fwd", "kan_dx")
# BLOCK_M, BLOCK_N (the forward's output tile; the backward's step over the outputs), BLOCK_K (the inputs' tile)
BLOCKS = {"kan_fwd": ((64, 128), (64, 128, 256), (32, 64, 128)), "kan_dx": ((32, 64, 128),) * 3}


def candidates(kernel: str, stages: tuple[int, ...]) -> list[tuple[int, int, int, int, int]]:
    """Tiles whose fp32 accumulator plus four basis temporaries take at most ~192 registers a thread (and whose
    accumulator is worth eight warps where it has them), and the module's own candidates."""
    tiles = set(kan_triton.TILES[kernel])
    for m, n, k, warps, s in itertools.product(*BLOCKS[kernel], (4, 8), stages):
        threads = 32 * warps
        acc = (m * n if kernel == "kan_fwd" else m * k) / threads
        basis = m * k / threads
        if acc + 4 * basis <= 192 and acc <= 128 and not (acc < 16 and warps == 8):
            tiles.add((m, n, k, warps, s))
    return sorted(tiles)


def autotuner_timings(kernel: str) -> list[dict]:
    """The last autotuning's time of every candidate, fastest first."""
    timings = kan_triton._autotuned(kernel).autotuner.configs_timings
    rows = []
    for config, ms in timings.items():
        ms = ms[0] if isinstance(ms, list | tuple) else ms
        kw = config.kwargs
        tile = [kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"], config.num_warps, config.num_stages]
        rows.append({"tile": tile, "ms": float(ms)})
    return sorted(rows, key=lambda r: r["ms"])


def errors(tokens: int, K: int, N: int, G: int) -> dict[str, float]:
    """||fused - fp64 reference|| / ||reference|| of y and every gradient, bf16 operands."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (1.5 * torch.randn(tokens, K, device="cuda", generator=gen)).bfloat16()
    gw = torch.randn(1, G, device="cuda", generator=gen)
    W = (torch.randn(N, K, device="cuda", generator=gen) * K**-0.5).bfloat16()
    dy = torch.randn(tokens, N, device="cuda", generator=gen).bfloat16()
    out = {}
    for name, cast in (("fused", None), ("ref", torch.float64)):
        leaves = [(t if cast is None else t.to(cast)).clone().requires_grad_() for t in (x, gw, W)]
        if cast is None:
            y = kan_linear(*leaves, *GRID, backend="fused")
        else:
            y = kan_linear_reference(*leaves, *GRID)
        y.backward(dy.to(y.dtype))
        out[name] = {"y": y.detach(), "dx": leaves[0].grad, "dgw": leaves[1].grad, "dW": leaves[2].grad}
    rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
    return {k: rel(out["fused"][k], out["ref"][k]) for k in out["ref"]}


def sweep_layer(tokens: int, K: int, N: int, G: int) -> dict:
    """Every candidate's time at x [tokens, K] -> [tokens, N], the winners' errors, and the layer beside the others."""
    x = (1.5 * torch.randn(tokens, K, device="cuda")).bfloat16()
    gw = torch.randn(1, G, device="cuda")
    W = (torch.randn(N, K, device="cuda") * K**-0.5).bfloat16()
    dy = torch.randn(tokens, N, device="cuda").bfloat16()
    kan_triton.kan_fwd(x, gw, W, *GRID)
    fwd = autotuner_timings("kan_fwd")
    kan_triton.kan_bwd(x, gw, W, dy, *GRID)
    timings = {"kan_fwd": fwd, "kan_dx": autotuner_timings("kan_dx")}
    return {
        "K": K,
        "N": N,
        "timings": timings,
        "errors": errors(tokens, K, N, G),
        "layer": bench_shared(tokens, K, N, G),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=25728, help="rows of x (default: LKAT-T's batch 128 x 201)")
    parser.add_argument("--dim", type=int, default=192)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--grid", type=int, default=4, help="G, LKAT's default")
    parser.add_argument("--stages", type=int, nargs="+", default=[3])
    parser.add_argument("--layers", nargs="+", default=["fc2", "fc1"], choices=["fc1", "fc2"])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    for kernel in KERNELS:  # before the first launch builds the autotuners
        kan_triton.TILES[kernel] = tuple(candidates(kernel, tuple(args.stages)))
    shapes = {"fc1": (args.dim, args.hidden), "fc2": (args.hidden, args.dim)}
    env = environment()
    results = {"tokens": args.tokens, "grid": args.grid, "candidates": kan_triton.TILES, **env}
    for layer in args.layers:
        results[layer] = sweep_layer(args.tokens, *shapes[layer], args.grid)
        write_result(args.out or dated_result_path("sweep_kan_tiles", env), results)
        res = results[layer]
        print(f"\n{layer}: [{args.tokens}, {res['K']}] -> {res['N']}, errors {res['errors']}")
        for kernel, rows in res["timings"].items():
            print(f"{kernel}: {len(rows)} candidates")
            print(
                markdown(["BLOCK_M, N, K, warps, stages", "ms"], [[str(r["tile"]), f"{r['ms']:.4f}"] for r in rows[:8]])
            )
        print(
            markdown(
                ["path", "kernel ms", "ms"],
                [[r["path"], f"{r['kernel_ms']:.4f}", f"{r['ms']:.3f}"] for r in res["layer"]],
            )
        )


if __name__ == "__main__":
    main()
