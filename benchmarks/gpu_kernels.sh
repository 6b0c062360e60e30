#!/usr/bin/env bash
# Kernel checks and figures on the GPU machine: the RBF and fused-KAN CUDA tests, then bench_rbf.py,
# bench_kan_layer.py and the fused KAN kernels' tile sweep at LKAT-T's fc2, each under `timeout`; logs and JSON under
# $OUT. About 10 minutes on an H100.
#   bash benchmarks/gpu_kernels.sh
# Carry .whl and .gpucache (see gpu_setup.sh).
set -u
source benchmarks/gpu_setup.sh

run() {  # run NAME SECONDS COMMAND...: log to $OUT/NAME.log, print the exit status and the last line
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? | $(tail -n 1 "$OUT/$name.log")"
}

run test_rbf_gpu 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_rbf_gpu.py
run test_kan_gemm_gpu 180 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_kan_gemm_gpu.py
cd benchmarks || exit 1
run bench_rbf 120 python3 bench_rbf.py --out "$OUT/bench_rbf.json"
run bench_kan_layer 90 python3 bench_kan_layer.py --out "$OUT/bench_kan_layer.json"
run sweep_kan_tiles 150 python3 sweep_kan_tiles.py --layers fc2 --out "$OUT/sweep_kan_tiles.json"
