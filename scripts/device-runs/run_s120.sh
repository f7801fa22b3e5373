#!/usr/bin/env bash
# run S120 (at most about 560 s, a fresh machine): the cuBLAS gemm of gemm's `cublas` and
# spmm's `cublas_dense` now cuBLASLt with each shape's plan kept (adaptive.backends.cuda_blas;
# S117: the same device time as cublasGemmEx, an eager call 0.004-0.011 ms cheaper where the
# kernel is short): its GPU tests (two streams at once on one plan included) and the cuBLAS
# entries' tests, the probe against cupy.matmul and torch.mm, then what S119 was to run (the
# mixed table, selection) and the contention run (S116: device time 1.16-1.34 with tc_wide
# committed at 2.58x cuBLAS's device time on gemm M=16, cuBLAS from CuPy issuing in 35-42 us)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cuda_blas_cuda.py tests/gpu/test_gemm_softmax_cuda.py tests/gpu/test_spmm_attention_cuda.py -k "cuda_blas or cublas or two_streams or float64 or side_stream" > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/tests.log" | cut -c1-300
t0=$SECONDS
timeout 40 python3 benchmarks/probe_cublaslt_plan.py > "$OUT/probe.log" 2>&1
echo "probe rc=$? $((SECONDS-t0)) s"; cut -c1-220 "$OUT/probe.log" | tail -13
mixed_table 170
grep -E "adaptive's policy" "$OUT/bench_mixed.log" | head -2
contention 110
if [ "$SECONDS" -lt 400 ]; then selection 150; else echo "selection skipped at $SECONDS s"; fi
