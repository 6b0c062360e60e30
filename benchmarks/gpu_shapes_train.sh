#!/usr/bin/env bash
# Issue 16's GPU runs, part 1 (one device call): LKAT-T and/or ViT-T trained at 224² on the shapes set, same recipe
# (shapes, batch 256), same 50,000 training and 2,000 validation images, each drawn once into memory
# (--cache-images) so that an epoch costs the augmentation, not the drawing. Both at once share the GPU and the
# 16 cores (side by side); one alone gets 15 loader workers. Runs land in runs/; metrics, logs and each best.pt in
# 15 MB parts (cat <model>_best.pt.part-* > best.pt) under $OUT.
#   LKAT_EPOCHS=8 VIT_EPOCHS=12 bash benchmarks/gpu_shapes_train.sh      (carry .whl and .gpucache; 0 epochs skips one)
set -u
source benchmarks/gpu_setup.sh
lkat_epochs=${LKAT_EPOCHS:-8} vit_epochs=${VIT_EPOCHS:-12}
workers=15
[ "$lkat_epochs" -gt 0 ] && [ "$vit_epochs" -gt 0 ] && workers=7
train() {  # train NAME EPOCHS MODEL (0 epochs: not trained)
  [ "$2" -gt 0 ] || return 0
  local t0=$SECONDS
  timeout $((deadline - SECONDS)) python3 -m lkat_lens.train --data shapes --img-size 224 --recipe shapes \
    --batch-size 256 --train-images 50000 --val-images 2000 --epochs "$2" --warmup-epochs 1 --clip-grad 1.0 \
    --workers "$workers" --cache-images --model "$3" --out-dir runs --name "$1" > "$OUT/$1.log" 2>&1
  echo "== $1: exit $? after $((SECONDS - t0)) s"
  tr '\r' '\n' < "$OUT/$1.log" | grep -E "^epoch .*top1" | tail -n 4
}
train lkat_t_shapes224 "$lkat_epochs" lkat_tiny_patch16_224 &
train vit_t_shapes224 "$vit_epochs" vit_tiny_patch16_224 &
wait
for run in runs/*_shapes224; do
  name=$(basename "$run")
  cp "$run/metrics.jsonl" "$OUT/$name-metrics.jsonl"
  [ -f "$run/best.pt" ] && split -b 15M "$run/best.pt" "$OUT/${name%_shapes224}_best.pt.part-"
done
