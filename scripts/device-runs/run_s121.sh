#!/usr/bin/env bash
# run S121 (at most about 480 s, a fresh machine): cuBLASLt's and cuSPARSELt's matmul
# called holding the GIL (cuda_libs.library(holding_gil=...): ctypes released it, and S120
# read cuBLAS's issuing in the dispatcher at 35-38 us least and 75-250 us sampled where it
# issues in 20 us pinned, committing tc_wide at 1.70x cuBLAS's device time on gemm
# 2048^3): both libraries' GPU tests, then the contention run, selection and the mixed table
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cuda_blas_cuda.py tests/gpu/test_spmm_cusparselt_plan_cuda.py > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/tests.log" | cut -c1-300
contention 110
selection 150
mixed_table 120
grep -E "adaptive's policy" "$OUT/bench_mixed.log" | head -2
