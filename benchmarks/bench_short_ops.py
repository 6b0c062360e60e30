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

import time

from bench_model import training_run  # benchmarks/ is the script folder
from interleaved import parser, prepared, ratio_summary, run_and_write, warm

RUNS = ("vit", "traced", "ops")
PAIRS = [(name, "vit") for name in RUNS[1:]]  # each LKAT run against ViT


def summary(rounds: list[dict]) -> dict:
    """Each LKAT run's ratio to ViT (ViT's step time over its own) by phase: per round, their median, fastest steps."""
    return ratio_summary(rounds, PAIRS)


def main() -> None:
    args = parser(__doc__, rounds=6).parse_args()
    env, out = prepared(args, "bench_short_ops")
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
