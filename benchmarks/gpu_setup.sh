# Sourced by the benchmarks/gpu_*.sh scripts at the start of a device call (run from the repository root):
# installs the carried .whl wheels (fla, einops) under /tmp/site and lkat-lens (editable), points Triton's cache
# at .gpucache/ and, on exit, leaves the autotuning results in $OUT/autotune.tar. `step NAME SECONDS CMD...` runs
# one step of a device call under timeout, cut to what is left of DEADLINE seconds (default 540) from the start.
# Here first (the GPU image has torch, triton, timm, scikit-learn; not fla, captum, plotly, dash):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#   --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#   fla-core==0.6.0 flash-linear-attention==0.6.0 captum==0.9.0 plotly==7.1.0 narwhals dash==4.4.1 flask \
#   werkzeug blinker itsdangerous click retrying importlib-metadata zipp lazy-importer nest-asyncio janus comm \
#   pydantic pydantic-core annotated-types typing-inspection typing-extensions einops pytest-xdist==3.8.0 execnet
# and carry .whl and .gpucache. After a call, `tar -xf autotune.tar -C .gpucache` here (and, when it came back,
# `cp inductor.tgz .gpucache/`), and the next call skips the tuning (fla autotunes every new shape on first
# use, about a minute each) and inductor's compiles it has cached.
start=$SECONDS
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$PWD/.gpucache/triton TRITON_CACHE_AUTOTUNING=1
# inductor's compiled graphs too (a compiled LKAT takes minutes to build cold), carried as .gpucache/inductor.tgz and
# back in $OUT/inductor.tgz when small
export TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor
[ -f .gpucache/inductor.tgz ] && tar -xzf .gpucache/inductor.tgz -C .gpucache
save_autotune() {
  (cd "$TRITON_CACHE_DIR/.." 2>/dev/null && find triton -name '*.autotune.json' | tar -cf "$OUT/autotune.tar" -T -)
  (cd .gpucache 2>/dev/null && [ -d inductor ] && tar -czf "$OUT/inductor.tgz" inductor &&
    [ "$(stat -c %s "$OUT/inductor.tgz")" -gt 25000000 ] && rm "$OUT/inductor.tgz")
}
trap save_autotune EXIT
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/install.log" 2>&1 || exit 1
python3 -c "import torch, triton, timm; print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, timm.__version__)"
deadline=$((start + ${DEADLINE:-540}))

step() {  # step NAME SECONDS COMMAND...: under timeout (at most what is left of DEADLINE), log to $OUT/NAME.log
  local name=$1 limit=$2 left=$((deadline - SECONDS))
  shift 2
  [ "$left" -lt "$limit" ] && limit=$left
  [ "$limit" -le 5 ] && { echo "== $name: skipped (no time left)"; return; }
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - t0)) s (limit $limit s)"
  tail -n "${TAIL:-12}" "$OUT/$name.log"
}

parallel_tests() {  # parallel_tests SECONDS FILE...: tests/gpu/FILE.py as concurrent pytest processes (Triton's
  # first compiles are CPU-bound and the machine has 16 cores), each under timeout; logs in $OUT/FILE.log. WORKERS=N
  # splits each file over N pytest-xdist workers (carry its wheels, pytest_xdist and execnet, in .whl)
  local limit=$1 left=$((deadline - SECONDS)) t0=$SECONDS name
  shift
  [ "$left" -lt "$limit" ] && limit=$left
  for name in "$@"; do
    timeout "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider ${WORKERS:+-n "$WORKERS"} "tests/gpu/$name.py" > "$OUT/$name.log" 2>&1 &
  done
  wait
  pkill -9 -f "compile_worke[r]"  # inductor's compile pool outlives a pytest that timeout killed; not in timings
  for name in "$@"; do  # the summary line, and the failures by name (the logs may not all come back)
    echo "== $name (concurrent, limit $limit s): $(tail -n 1 "$OUT/$name.log")"
    grep -E '^(FAILED|ERROR) ' "$OUT/$name.log" | cut -c1-300
  done
  echo "== concurrent tests: $((SECONDS - t0)) s"
}
