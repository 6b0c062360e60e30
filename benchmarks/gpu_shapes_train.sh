#!/usr/bin/env bash
# Issue 16's GPU runs, part 1 (one device call): LKAT-T and ViT-T trained side by side on one GPU at 224² on the
# shapes set, same recipe (shapes, batch 256), same 50,000 training and 2,000 validation images. Runs land in
# runs/ (kept on the machine for gpu_shapes_eval.sh in the next call); metrics and logs under $OUT.
#   LKAT_EPOCHS=8 VIT_EPOCHS=12 bash benchmarks/gpu_shapes_train.sh      (carry .whl and .gpucache; 0 epochs skips one)
set -u
source benchmarks/gpu_setup.sh
train() {  # train NAME EPOCHS WORKERS MODEL (0 epochs: not trained)
  [ "$2" -gt 0 ] || return 0
  local t0=$SECONDS
  timeout $((deadline - SECONDS)) python3 -m lkat_lens.train --data shapes --img-size 224 --recipe shapes \
    --batch-size 256 --train-images 50000 --val-images 2000 --epochs "$2" --warmup-epochs 1 --clip-grad 1.0 \
    --workers "$3" --model "$4" --out-dir runs --name "$1" > "$OUT/$1.log" 2>&1
  echo "== $1: exit $? after $((SECONDS - t0)) s"
  tr '\r' '\n' < "$OUT/$1.log" | grep -E "^epoch .*top1" | tail -n 4
}
train lkat_t_shapes224 "${LKAT_EPOCHS:-8}" 9 lkat_tiny_patch16_224 &
train vit_t_shapes224 "${VIT_EPOCHS:-12}" 7 vit_tiny_patch16_224 &
wait
for run in runs/*_shapes224; do cp "$run/metrics.jsonl" "$OUT/$(basename "$run")-metrics.jsonl"; done
