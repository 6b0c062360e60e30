"""The GLA core's short kernels traced or as custom ops in a compiled LKAT, beside ViT, interleaved in one process.

Issue 19: inductor drops the register cap of a user-defined Triton kernel, so the traced short kernels run slower
on the device, while the custom ops (`LKAT.set_backends(cuda_graphs=True)`, kernels/gla_core.py) cost host time on
every call. Three runs of one size at batch 128, 224², each `torch.compile(mode, fullgraph=True)` with fused AdamW
under bf16 autocast (`bench_model.training_run`): ViT, LKAT with the short kernels traced, LKAT with them as ops. After
warm-up, --rounds rounds (the order rotating) time --iters synchronised training steps and inference steps of each;
the JSON holds every round's median and fastest step and each LKAT's ratio to ViT (per round, their median, and of
the fastest steps). On the lent machines a step's host time moves between processes and within one, so only ratios
taken in one round compare.

    python benchmarks/bench_short_ops.py --mode default --out benchmarks/results/bench_short_ops-h200-<date>.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from bench_model import training_run  # benchmarks/ is the script folder
from common import dated_result_path, environment
from interleaved import ratio_summary, run_and_write, warm

RUNS = ("vit", "traced", "ops")
PAIRS = [(name, "vit") for name in RUNS[1:]]  # each LKAT run against ViT


def summary(rounds: list[dict]) -> dict:
    """Each LKAT run's ratio to ViT (ViT's step time over its own) by phase: per round, their median, fastest steps."""
    return ratio_summary(rounds, PAIRS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny", choices=["tiny", "small", "base"])
    parser.add_argument("--mode", default="default", help="torch.compile's mode")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_short_ops.py needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = True
    env = environment()
    out = args.out or dated_result_path(f"bench_short_ops_{args.size}_{args.mode}", env)
    result: dict = {"environment": env, "size": args.size, "mode": args.mode, "compile_s": {}}
    runs = {}
    for name in RUNS:
        start = time.time()
        model = f"{'vit' if name == 'vit' else 'lkat'}_{args.size}_patch16_224"
        backends = None if name == "vit" else {"cuda_graphs": name == "ops"}
        runs[name] = training_run(model, args.mode, "cuda", 128, 224, backends=backends, tune_first=name != "vit")
        warm(runs[name])
        result["compile_s"][name] = time.time() - start
    run_and_write(runs, PAIRS, args, result, out)


if __name__ == "__main__":
    main()
