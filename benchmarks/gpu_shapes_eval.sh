#!/usr/bin/env bash
# Issue 16's GPU runs, part 2 (the next device call, on the machine that ran gpu_shapes_train.sh): every relevance
# map of both models scored against the shapes masks (lkat-lens evaluate), then the H100 rows of issue 17's patching
# benchmark (the trained LKAT-T) and issue 15's explorer benchmark (random-init LKAT-B). JSON under $OUT, and the
# LKAT-T checkpoint in 15 MB parts (cat lkat_t_best.pt.part-* > best.pt).
#   MODELS="lkat_t vit_t" bash benchmarks/gpu_shapes_eval.sh      (carry .whl and .gpucache)
set -u
source benchmarks/gpu_setup.sh
split -b 15M runs/lkat_t_shapes224/best.pt "$OUT/lkat_t_best.pt.part-"
TAIL=16
for model in ${MODELS:-lkat_t vit_t}; do
  step "evaluate_$model" "${EVAL_SECONDS:-200}" python3 -m lkat_lens_cli evaluate \
    "runs/${model}_shapes224/best.pt" --device cuda --num-images "${EVAL_IMAGES:-100}" --mprt-images "${MPRT_IMAGES:-24}" \
    --format html --out "/tmp/evaluate_$model"
  cp "/tmp/evaluate_$model/evaluation.json" "$OUT/evaluation_${model}_shapes224.json" 2>/dev/null
done
TAIL=6
step bench_patching "${PATCH_SECONDS:-60}" python3 benchmarks/bench_patching.py --checkpoint runs/lkat_t_shapes224/best.pt \
  --device cuda --out "$OUT/patching_h100.json"
step bench_explorer 90 python3 benchmarks/bench_explorer.py --device cuda --out "$OUT/explorer_h100.json"
