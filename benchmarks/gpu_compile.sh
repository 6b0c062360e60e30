#!/usr/bin/env bash
# Issue 19 in one device call (under 10 minutes; each step's limit is cut to what is left of DEADLINE seconds):
# bench_model.py --compare (LKAT of each size in SIZES with each GLA mode of ATTN vs its ViT in each compile mode of
# MODES, profiled: launches, GPU busy, kernel time, memory; COMPARE_ARGS adds options, e.g. "--gla-input fused torch"),
# the GLA length sweep of chunk against short at LENGTHS (AUTO_SHORT_MAX_T; empty: skipped), then the GPU tests
# named in TESTS, concurrently.
#   MODES="default reduce-overhead" ATTN="chunk short" TESTS="test_compile_gpu" bash benchmarks/gpu_compile.sh
# (carry .whl and .gpucache; see gpu_setup.sh). Logs and JSON under $OUT.
set -u
source benchmarks/gpu_setup.sh

# shellcheck disable=SC2086  # SIZES, MODES, ATTN, COMPARE_ARGS, LENGTHS and TESTS are word lists
step bench_model_compare "${COMPARE_SECONDS:-420}" python3 benchmarks/bench_model.py --compare --sizes ${SIZES:-tiny} \
  --attn ${ATTN:-chunk short} --kan auto --compile-modes ${MODES:-reduce-overhead} --warmup 3 --iters 10 \
  ${COMPARE_ARGS:-} --out "$OUT/bench_model_compare.json"
LENGTHS=${LENGTHS-64 201 401 1029 2048 4096}
# shellcheck disable=SC2086
[ -n "$LENGTHS" ] && step bench_gla_lengths 90 python3 benchmarks/bench_gla.py --lengths $LENGTHS \
  --out "$OUT/bench_gla_lengths.json"
# shellcheck disable=SC2086
[ -n "${TESTS:-}" ] && parallel_tests 200 $TESTS
true
