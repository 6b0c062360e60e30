#!/usr/bin/env bash
# The GPU correctness tests in one device call (each step cut to what is left of DEADLINE seconds): the kernels
# and whole models against their references, the custom ops under torch.compile, the study and the interventions
# on CUDA against the CPU. Logs under $OUT.
#   bash benchmarks/gpu_checks.sh        (carry .whl and .gpucache; see gpu_setup.sh)
set -u
source benchmarks/gpu_setup.sh
gpu_test() { step "$1" "$2" python3 -m pytest -q -m gpu -p no:cacheprovider "tests/gpu/$1.py"; }
TAIL=3
gpu_test test_rbf_gpu 60
gpu_test test_kan_gemm_gpu 100
gpu_test test_gla_short_gpu 80
gpu_test test_lkat_gpu 80
gpu_test test_reference_configs_gpu 80
gpu_test test_interventions_gpu 60
gpu_test test_interventions_gla_kan_gpu 60
gpu_test test_study_gpu 60
gpu_test test_compile_gpu 230
