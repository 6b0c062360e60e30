#!/usr/bin/env bash
# One device call: install the carried wheels and lkat-lens, run tests/gpu and the model benchmark, logs under $OUT.
#   bash benchmarks/gpu_session.sh [test files...]      (carry .whl and .gpucache; see gpu_setup.sh)
set -u
source benchmarks/gpu_setup.sh
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(tests/gpu/test_lkat_gpu.py tests/gpu/test_rbf_gpu.py tests/gpu/test_gla_gpu.py tests/gpu/test_train_gpu.py)
for f in "${files[@]}"; do
  name=$(basename "${f%%::*}" .py)
  timeout "${GPU_TEST_TIMEOUT:-400}" python3 -m pytest -q -m gpu -p no:cacheprovider -s "$f" > "$OUT/$name.log" 2>&1
  echo "$f: exit $? | $(tail -n 1 "$OUT/$name.log")"
done
if [ -z "${SKIP_BENCH:-}" ]; then
  timeout "${BENCH_TIMEOUT:-400}" python3 benchmarks/bench_model.py --batch 128 --out "$OUT/bench_model.json" \
    > "$OUT/bench_model.log" 2>&1
  tail -n 6 "$OUT/bench_model.log"
fi
