#!/usr/bin/env bash
# run S125 (not run yet; at most about 150 s, a fresh machine or after another run): why the
# mixed table prices cuBLAS above its live samples (S121-S123: 0.055-0.066 ms a call on
# float32 gemms where live samples read 0.010-0.020; cublas_dense 0.040-0.097 on float32
# spmm M=2048 N=16): the table's pinned launches against the pinned plan run directly,
# the entry on kept output, 16 calls a synchronise, and device time; first the cuBLAS gemm's
# GPU tests (its alpha/beta pointers made once since its last GPU run)
source "$(dirname "$0")/setup.sh"
gpu_tests 60 tests/gpu/test_cuda_blas_cuda.py
probe 80 pricing 30 benchmarks/probe_table_pricing.py
