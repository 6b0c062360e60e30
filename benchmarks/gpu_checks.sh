#!/usr/bin/env bash
# The GPU correctness tests in one device call (cut to what is left of DEADLINE seconds): the kernels and whole
# models against their references, the custom ops and the traced GLA core under torch.compile, the study and the
# interventions on CUDA against the CPU, as concurrent pytest processes. Logs under $OUT.
#   bash benchmarks/gpu_checks.sh                      (carry .whl and .gpucache; see gpu_setup.sh)
#   bash benchmarks/gpu_checks.sh test_gla_short_gpu   (only these files of tests/gpu/)
#   WORKERS=5 bash benchmarks/gpu_checks.sh test_gla_short_gpu test_gla_gpu   (each file over 5 xdist workers)
# On a cold machine (no compiled Triton kernels: the cache carries only the tuning) the sixteen files take more than
# one call; fewer at a time each get more of the 16 cores for their compiles.
set -u
ALL=(test_rbf_gpu test_kan_gemm_gpu test_gla_short_gpu test_gla_gpu test_lkat_gpu test_reference_configs_gpu
  test_interventions_gpu test_interventions_gla_kan_gpu test_study_gpu test_compile_gpu test_gla_core_gpu
  test_gated_norm_gpu test_gla_gate_gpu test_gla_input_gpu test_chunk_states_gpu test_tuned_gpu)
source benchmarks/gpu_setup.sh
parallel_tests 500 "${@:-${ALL[@]}}"
