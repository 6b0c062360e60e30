#!/usr/bin/env bash
# End-to-end speed (issue 8) on the GPU, one device call per invocation; logs and JSON under $OUT.
#   bash benchmarks/gpu_e2e.sh [part ...]      (default: check table)
# Parts, each step bounded by `timeout` (seconds in brackets; "check table" stays under 9 minutes):
#   check    tests/gpu/test_gla_short_gpu.py [200], then benchmarks/bench_gla.py with a chunk-vs-short
#            length sweep [100]
#   table    bench_model.py main table at 224², batch 128, eager: ViT-T/S/B, LKAT-T/S/B with chunk,
#            fused_recurrent and short, the paper's-code configuration [230]
#   compile  bench_model.py compiled rows: ViT-S, LKAT-S short and chunk [500]
#   sweep    bench_model.py --sweep: LKAT-S ("auto") vs ViT-S at 224, 512, 1024, 1536, 2048 [500]
# Carry .whl and .gpucache (see gpu_setup.sh).
# bench_model.py rewrites its JSON after every row, so a step cut short by its timeout keeps what it measured.
set -u
source benchmarks/gpu_setup.sh

step() {  # step NAME SECONDS COMMAND...: run under timeout, log to $OUT/NAME.log, print the exit code and the tail
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - start)) s"
  tail -n "${TAIL:-25}" "$OUT/$name.log"
}

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(check table)
for part in "${parts[@]}"; do
  case $part in
    check)
      step test_gla_short_gpu 200 python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/gpu/test_gla_short_gpu.py
      step bench_gla 100 python3 benchmarks/bench_gla.py --lengths 201 512 1029 2048 4101 --out "$OUT/bench_gla.json" ;;
    table)
      step bench_model 230 python3 benchmarks/bench_model.py --warmup 2 --iters 6 --out "$OUT/bench_model.json" ;;
    compile)
      step bench_model_compile 500 python3 benchmarks/bench_model.py --sizes small --attn short chunk --compile on \
        --warmup 3 --iters 6 --out "$OUT/bench_model_compile.json" ;;
    sweep)
      step bench_model_sweep 500 python3 benchmarks/bench_model.py --sweep --attn auto --warmup 2 --iters 5 \
        --out "$OUT/bench_model_sweep.json" ;;
    *)
      echo "unknown part $part (check, table, compile, sweep)"; exit 2 ;;
  esac
done
