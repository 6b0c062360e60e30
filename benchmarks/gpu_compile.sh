#!/usr/bin/env bash
# Issue 19 in one device call (under 10 minutes; each step's limit is cut to what is left of DEADLINE seconds):
# the custom-op and compile tests, bench_model.py --compare (LKAT-T vs ViT-T, eager / compiled / CUDA graphs,
# profiled: launches, GPU busy, copies, memory), then the whole-model and fused-KAN regression tests.
#   bash benchmarks/gpu_compile.sh        (carry .whl and .gpucache; see gpu_setup.sh). Logs and JSON under $OUT.
set -u
source benchmarks/gpu_setup.sh

step test_compile_gpu 230 python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/gpu/test_compile_gpu.py
step bench_model_compare 250 python3 benchmarks/bench_model.py --compare --sizes tiny \
  --compile-modes eager default reduce-overhead --warmup 3 --iters 10 --out "$OUT/bench_model_compare.json"
step test_lkat_gpu 90 python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/gpu/test_lkat_gpu.py
step test_kan_gemm_gpu 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_kan_gemm_gpu.py
