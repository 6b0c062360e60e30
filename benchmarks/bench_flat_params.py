"""ViT and LKAT compiled with their parameters as they are and flattened (lkat_lens.flat_params), in one process.

Issue 19: a compiled LKAT-T training step is bound by the host, which works per parameter tensor (torch.compile's
graph inputs and gradient outputs, gradient accumulation, the optimizer's and zero_grad's loops; LKAT-T has 285, ViT-T
152). The trainer flattens the models it compiles without CUDA graphs (train.flattens_parameters; under CUDA graphs
LKAT-T lost by it). Four runs of one size at batch 128, 224², each
`torch.compile(mode, fullgraph=True)` with fused AdamW under bf16 autocast (`bench_model.training_run`): ViT and LKAT,
each as it is and flattened, timed in --rounds interleaved rounds of --iters synchronised training steps and inference
steps (benchmarks/interleaved.py). The JSON holds every round and the ratios: each LKAT against each ViT, and each
flattened model against itself as it is. Without gradients a flattened model runs itself (FlatParameters.forward), so
its inference differs from the model's only in where its parameters are stored.

    python benchmarks/bench_flat_params.py --mode default --out benchmarks/results/bench_flat_params-h200-<date>.json
"""

from __future__ import annotations

import time

from bench_model import training_run  # benchmarks/ is the script folder
from interleaved import parser, prepared, run_and_write, warm

RUNS = ("vit", "vit_flat", "lkat", "lkat_flat")
PAIRS = [
    ("lkat", "vit"),
    ("lkat_flat", "vit_flat"),
    ("lkat_flat", "vit"),
    ("lkat_flat", "lkat"),
    ("vit_flat", "vit"),
]


def main() -> None:
    args = parser(
        __doc__, rounds=8, mode_help="torch.compile's mode (not eager: the trainer flattens only compiled runs)"
    ).parse_args()
    env, out = prepared(args, "bench_flat_params")
    result: dict = {"environment": env, "size": args.size, "mode": args.mode, "compile_s": {}, "tensors": {}}
    runs = {}
    for name in RUNS:
        start = time.time()
        model = f"{name.split('_')[0]}_{args.size}_patch16_224"
        runs[name] = training_run(model, args.mode, "cuda", 128, 224, tune_first=True, flat=name.endswith("_flat"))
        result["tensors"][name] = sum(len(group["params"]) for group in runs[name].optimizer.param_groups)
        warm(runs[name])
        result["compile_s"][name] = time.time() - start
        print(f"{name}: built in {result['compile_s'][name]:.0f} s, {result['tensors'][name]} tensors", flush=True)
    run_and_write(runs, PAIRS, args, result, out)


if __name__ == "__main__":
    main()
