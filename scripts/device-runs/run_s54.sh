#!/usr/bin/env bash
# run S54 (on S53's machine): the contention run again, with gemm's cublas variant calling
# cublasGemmEx directly (tree of 193b600; the shipped pack's cuBLAS rows were then ignored:
# the variant's code differed from the pack's)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 100 python3 benchmarks/gpu_contention.py --out "$OUT" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"
tail -9 "$OUT/contention.log"
