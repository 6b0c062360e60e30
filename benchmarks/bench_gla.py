"""Time the GLA sublayer at LKAT-S's training shape against softmax attention (SDPA), forward and forward+backward.

    python benchmarks/bench_gla.py --out benchmarks/results/bench_gla.json

Rows: fla's chunk_gla and fused_recurrent_gla, lkat-lens's short-sequence kernel ("short"), and
torch's scaled_dot_product_attention on the same heads ([B, H, T, D], not causal, as in a ViT).
Each GLA row also gets its largest error against the fp64 recurrence (on a smaller batch). Every time is taken
twice: called from Python (the host's dispatch included, which at these sizes is most of it) and replayed as a CUDA
graph (the GPU's time, as in a model trained under CUDA graphs); the ratios to SDPA are the graph times'.
Writes JSON and prints a markdown table. --lengths adds a sweep of chunk against short over T (--segments: short
also walking segments of each given length, 0 the whole sequence at once), --states-lengths one of chunk mode's two
ways of passing states between chunks (fla's serial walks, or in parallel by `kernels.chunk_states`;
`kernels.gla_fla.PARALLEL_STATES_MIN_T` chooses), both at the same tokens per batch:

    python benchmarks/bench_gla.py --iters 10 --lengths 16389 4101 1029 513 201 --segments 0 64 128 256 --out ...
    python benchmarks/bench_gla.py --iters 10 --states-lengths 16389 8197 4101 3077 2053 1029 --out ...
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from bench_model import time_ms  # benchmarks/ is the script folder
from common import dated_result_path, environment, write_result

from lkat_lens.kernels import gla_fla, gla_short
from lkat_lens.kernels.gla import gated_linear_attention, gla_recurrent

GLA_MODES = ("chunk", "fused_recurrent", "short")


def make_inputs(B: int, T: int, H: int, D: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    """q, k, v [B, T, H, D] in dtype, fp32 log gates logsigmoid(randn) / 16 (LKAT's), an output gradient."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(B, T, H, D, device="cuda", generator=gen).to(dtype) for _ in range(4))
    gk = F.logsigmoid(torch.randn(B, T, H, D, device="cuda", generator=gen)) / 16
    return [q, k, v, gk, do]


def gla(mode: str):
    """The GLA sublayer in one dispatcher mode, as a function of (q, k, v, gk)."""
    return lambda q, k, v, gk: gated_linear_attention(q, k, v, gk, mode=mode)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor) -> torch.Tensor:
    """Softmax attention on the same heads (gk unused), [B, T, H, D] in and out."""
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return o.transpose(1, 2)


def graphed(step) -> Callable[[], None]:
    """step captured in a CUDA graph, after warm-up runs on a side stream (which also autotune): its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def timings(fn, inputs: list[torch.Tensor], warmup: int, iters: int) -> dict[str, float]:
    """Median ms of the forward alone and of forward + backward (gradients of q, k, v, gk): called from Python
    ("fwd_ms", "fwd_bwd_ms": the host's dispatch included) and replayed as a CUDA graph ("*_graph_ms": the GPU's
    time alone, as in a model trained under CUDA graphs)."""
    q, k, v, gk, do = (x.detach().requires_grad_(i < 4) for i, x in enumerate(inputs))

    def forward():
        with torch.no_grad():
            fn(q, k, v, gk)

    def forward_backward():
        torch.autograd.backward(fn(q, k, v, gk), do)
        for x in (q, k, v, gk):
            x.grad = None

    out = {"fwd_ms": time_ms(forward, warmup, iters), "fwd_bwd_ms": time_ms(forward_backward, warmup, iters)}
    out["fwd_graph_ms"] = time_ms(graphed(forward), warmup, iters)
    out["fwd_bwd_graph_ms"] = time_ms(graphed(forward_backward), warmup, iters)
    return out


def max_errors(fn, inputs: list[torch.Tensor]) -> dict[str, float]:
    """max |x - ref| / max |ref| of o, dq, dk, dv, dgk against the fp64 recurrence."""

    def run(f, xs, do):
        leaves = [x.detach().clone().requires_grad_() for x in xs]
        o = f(*leaves)
        return [o.detach(), *torch.autograd.grad(o, leaves, do.to(o.dtype))]

    got = run(fn, inputs[:4], inputs[4])
    ref = run(lambda *x: gla_recurrent(*(t.double() for t in x))[0], inputs[:4], inputs[4])
    names = ("o", "dq", "dk", "dv", "dgk")
    return {n: ((g.double() - r).abs().max() / r.abs().max()).item() for n, g, r in zip(names, got, ref, strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=201)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--error-batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--lengths", nargs="*", type=int, default=[], help="also time chunk vs short at these T")
    parser.add_argument(
        "--segments", nargs="*", type=int, default=[], help="--lengths: also short walking segments of these lengths"
    )
    parser.add_argument("--states-lengths", nargs="*", type=int, default=[], help="also time chunk's state passing")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    shape = (args.batch, args.tokens, args.heads, args.head_dim)
    inputs = make_inputs(*shape, torch.bfloat16)
    small = make_inputs(args.error_batch, *shape[1:], torch.bfloat16, seed=1)
    rows = []
    for name, fn in [*((m, gla(m)) for m in GLA_MODES), ("sdpa", sdpa)]:
        row = {"op": name, "shape_BTHD": shape, "dtype": "bfloat16", **timings(fn, inputs, args.warmup, args.iters)}
        if name != "sdpa":
            row["max_rel_err_vs_fp64"] = max_errors(fn, small)
        rows.append(row)
    base = rows[-1]
    env = environment()
    for row in rows:
        for key in ("fwd", "fwd_bwd", "fwd_graph", "fwd_bwd_graph"):
            row[f"{key}_x_sdpa"] = row[f"{key}_ms"] / base[f"{key}_ms"]
        row.update(env)
    lengths = length_sweep(args) if args.lengths else []
    states = states_sweep(args) if args.states_lengths else []
    payload = {"sublayer": rows, "lengths": lengths, "states": states}
    write_result(args.out or dated_result_path("bench_gla", env), payload)
    print(f"GLA sublayer, B T H D = {shape}, bf16 (gates fp32); errors on batch {args.error_batch}")
    print(
        "| op | fwd ms | fwd+bwd ms | fwd ms, graph | fwd+bwd ms, graph | fwd × SDPA, graph | fwd+bwd × SDPA, graph "
        "| fwd+bwd × SDPA, from Python | max rel err (o, dq, dk, dv, dgk) | GPU | torch | triton |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        err = ", ".join(f"{e:.1e}" for e in r.get("max_rel_err_vs_fp64", {}).values()) or "—"
        print(
            f"| {r['op']} | {r['fwd_ms']:.3f} | {r['fwd_bwd_ms']:.3f} | {r['fwd_graph_ms']:.3f} | "
            f"{r['fwd_bwd_graph_ms']:.3f} | {r['fwd_graph_x_sdpa']:.2f}× | {r['fwd_bwd_graph_x_sdpa']:.2f}× | "
            f"{r['fwd_bwd_x_sdpa']:.2f}× | {err} | {r['gpu']} | {r['torch']} | {r['triton']} |"
        )
    if lengths:
        print_lengths(lengths, args.segments)
    if states:
        print_states(states)


def batch_for(args: argparse.Namespace, T: int) -> int:
    """The batch that keeps tokens per batch near --batch x --tokens at sequence length T."""
    return max(1, round(args.batch * args.tokens / T))


def short_segments(segment: int):
    """The short kernels walking segments of `segment` tokens (0: the whole sequence), as a function of (q, k, v,
    gk)."""
    return lambda q, k, v, gk: gla_short.gla_short(q, k, v, gk, segment=segment)


def length_sweep(args: argparse.Namespace) -> list[dict]:
    """Forward and fwd+bwd ms (CUDA graph replays) of chunk and short (its segments as gla_short.segment_length
    sets them), and of short with each segment length of --segments ("short<length>"), at each T of --lengths,
    batch ~ batch * tokens / T (the same tokens per batch)."""
    rows = []
    for T in args.lengths:
        batch = batch_for(args, T)
        inputs = make_inputs(batch, T, args.heads, args.head_dim, torch.bfloat16)
        row = {"T": T, "batch": batch, "segment": gla_short.segment_length(T)}
        fns = {"chunk": gla("chunk"), "short": gla("short")} | {f"short{s}": short_segments(s) for s in args.segments}
        for name, fn in fns.items():
            times = timings(fn, inputs, args.warmup, args.iters)
            row |= {f"{name}_fwd_ms": times["fwd_graph_ms"], f"{name}_fwd_bwd_ms": times["fwd_bwd_graph_ms"]}
        rows.append(row)
    return rows


def states_sweep(args: argparse.Namespace) -> list[dict]:
    """Forward and fwd+bwd ms (CUDA graph replays) of chunk mode with serial and with parallel state passing at
    each T of --states-lengths (gla_fla.PARALLEL_STATES_MIN_T set to send every T one way, then restored)."""
    rows, threshold = [], gla_fla.PARALLEL_STATES_MIN_T
    try:
        for T in args.states_lengths:
            batch = batch_for(args, T)
            inputs = make_inputs(batch, T, args.heads, args.head_dim, torch.bfloat16)
            row = {"T": T, "batch": batch}
            for name, min_t in (("serial", T + 1), ("parallel", 0)):
                gla_fla.PARALLEL_STATES_MIN_T = min_t
                times = timings(gla("chunk"), inputs, args.warmup, args.iters)
                row |= {f"{name}_fwd_ms": times["fwd_graph_ms"], f"{name}_fwd_bwd_ms": times["fwd_bwd_graph_ms"]}
            rows.append(row)
    finally:
        gla_fla.PARALLEL_STATES_MIN_T = threshold
    return rows


def print_comparison(rows: list[dict], base: str, other: str) -> None:
    """A sweep's rows as markdown: `other` against `base`, forward and forward + backward (graph ms)."""
    print(
        f"\n| T | batch | {base} fwd ms | {other} fwd ms | fwd: {other} × {base} | {base} fwd+bwd ms "
        f"| {other} fwd+bwd ms | fwd+bwd: {other} × {base} |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [f"{r[f'{name}_{what}_ms']:.3f}" for what in ("fwd", "fwd_bwd") for name in (base, other)]
        ratios = [f"{r[f'{other}_{what}_ms'] / r[f'{base}_{what}_ms']:.2f}×" for what in ("fwd", "fwd_bwd")]
        print(f"| {r['T']} | {r['batch']} | {' | '.join([*cells[:2], ratios[0], *cells[2:], ratios[1]])} |")


def print_states(rows: list[dict]) -> None:
    """The state-passing sweep as markdown, and the shortest T from which parallel passing won at every longer T."""
    print_comparison(rows, "serial", "parallel")
    for what in ("fwd_bwd", "fwd"):
        wins = {r["T"]: r[f"parallel_{what}_ms"] < r[f"serial_{what}_ms"] for r in rows}
        from_t = min((t for t in wins if all(won for u, won in wins.items() if u >= t)), default=None)
        print(f"parallel state passing's {what} won at every T from {from_t if from_t else 'none'} on")


def print_lengths(rows: list[dict], segments: list[int]) -> None:
    """The length sweep as markdown (chunk against short, and against short at each of `segments`), and the longest
    T at which "short" beat "chunk" (training and forward only)."""
    for name in ["short", *(f"short{s}" for s in segments)]:
        print_comparison(rows, "chunk", name)
    for what in ("fwd_bwd", "fwd"):
        faster = [r["T"] for r in rows if r[f"short_{what}_ms"] < r[f"chunk_{what}_ms"]]
        print(f"longest T where short's {what} beat chunk's: {max(faster) if faster else 'none'}")


if __name__ == "__main__":
    main()
