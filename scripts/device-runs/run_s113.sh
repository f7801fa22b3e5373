#!/usr/bin/env bash
# run S113 (at most about 560 s, a fresh machine): the GPU tests of the cuBLAS entries (spmm's
# dense baseline now one cublasGemmEx, as gemm's cublas; through cupy.matmul S112 priced it
# 0.103 ms a call for a 0.020 ms kernel) and of cuSPARSELt; the kept-plan cuSPARSELt variant
# (in the manifest since S111) measured on the shipped pack's 18 float16 2:4 inputs and
# merged into it (commit $OUT/merged.msgpack as adaptive/packs/h200.msgpack); then the mixed
# table (S112: spmm 1.485 against best-fixed 1.090), selection (first result after each
# policy runs alone and the decide's array reads; S112: 5.83 / 3.33 / 5.51 ms) and the 2:4
# bar with the kept plans (S106: 0.71-0.78x the better way at N=256-512)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_spmm_attention_cuda.py tests/gpu/test_gemm_softmax_cuda.py tests/gpu/test_spmm_24_cuda.py -k "cublas or cusparselt" > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/tests.log" | cut -c1-300
extend_pack scripts/device-runs/sparse24_inputs.json csltplan 60 cusparselt_plan
rm -f "$OUT/csltplan.msgpack" "$OUT/merge.log"
mixed_table 70
selection 110
sparse24_bar 240 170
