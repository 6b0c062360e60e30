#!/usr/bin/env bash
# Issue 16's GPU runs, part 2: every relevance map of both models scored against the shapes masks (lkat-lens
# evaluate), then the H100 rows of issue 17's patching benchmark (the trained LKAT-T) and issue 15's explorer
# benchmark (random-init LKAT-B). JSON under $OUT. The checkpoints are runs/<model>_shapes224/best.pt: rebuilt here
# from the parts gpu_shapes_train.sh brought back (cat <model>_best.pt.part-* > runs/<model>_shapes224/best.pt) and
# carried with runs (with dash's wheel set aside, .whl + .gpucache + both checkpoints fit the 64 MiB carry).
#   MODELS="lkat_t vit_t" EVAL_IMAGES=32 MPRT_IMAGES=8 bash benchmarks/gpu_shapes_eval.sh   (carry .whl, .gpucache, runs)
set -u
source benchmarks/gpu_setup.sh
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
