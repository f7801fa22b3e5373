#!/usr/bin/env bash
# run S53: the new paths' GPU tests (gemm's cublas variant now one cublasGemmEx from CuPy
# arrays; an attention class held on SDPA served by transformers' own SDPA function), then
# what a gemm call from CuPy arrays costs the host each way (S51's contention: cuBLAS's
# exploring issuing read 83 us from CuPy arrays, tc_wide's 19, and tc_wide was committed
# at 4x cuBLAS's device time)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 40 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemm_softmax_cuda.py -k "gemm/cublas" > "$OUT/tests_cublas.log" 2>&1
echo "cublas tests rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/tests_cublas.log" | cut -c1-300
t0=$SECONDS
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_integration_fast_paths_cuda.py tests/gpu/test_transformers_cuda.py > "$OUT/tests.log" 2>&1
echo "integration tests rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/tests.log" | cut -c1-300
t0=$SECONDS
timeout 60 python3 benchmarks/gpu_hostpath.py --cases cupy-gemm --out "$OUT" > "$OUT/hostpath.log" 2>&1
echo "hostpath rc=$? $((SECONDS-t0)) s"; cat "$OUT/hostpath.log" | cut -c1-200
