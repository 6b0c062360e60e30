#!/usr/bin/env bash
# One device call: install the carried wheels and lkat-lens, run tests/gpu and the model benchmark, logs under $OUT.
# Here first:  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#   --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
#   fla-core==0.6.0 flash-linear-attention==0.6.0 einops==0.8.2
# then run `bash benchmarks/gpu_session.sh [test files...]` on the device with `.whl` carried.
# fla autotunes every new shape on first use (about a minute each), so budget several minutes per file.
# Autotuning results are cached under .gpucache/ and returned as $OUT/autotune.tar: unpack it into .gpucache/
# here (tar -xf autotune.tar -C .gpucache) and carry .gpucache with .whl: later calls skip the tuning.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$PWD/.gpucache/triton TRITON_CACHE_AUTOTUNING=1
save_autotune() { (cd .gpucache && find triton -name '*.autotune.json' | tar -cf "$OUT/autotune.tar" -T -); }
trap save_autotune EXIT
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/install.log" 2>&1 || exit 1
python3 -c "import torch, triton, timm; print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, timm.__version__)"
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
