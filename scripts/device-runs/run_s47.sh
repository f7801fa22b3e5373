#!/usr/bin/env bash
# run S47 (after S46): the shipped pack rebuilt on the wide preset with 24 more decode
# attention cases (two in three Lq = 1, caches of 64-16k keys) and rmsnorm's 20 (S17's
# build: 124 cases in 276 s on a warm kernel cache), then the selection benchmark on it
# (S43, old pack: learned-shipped decode-heavy 1.067, its largest excess B=1 Lq=1 Lk=128
# on flash_mma at 1.47x decode_global, which the old pack had no short-Lk row of); also
# the first of this tree's cheaper miss (rows as parts, the matrix per key order) and of
# the policy's race (tuning runs: S43 long-burst 13.3% against the 10% bar)
# Before it, in the checkout: `git checkout 193b600 -- variants/gemm/cublas.py` (cuBLAS from
# CuPy arrays as one cublasGemmEx: S54's issuing charge ~40 us against cupy.matmul's ~83),
# so that the pack's cuBLAS rows are of that code; commit it with the pack
source "$(dirname "$0")/setup.sh"
build_pack 330
t0=$SECONDS
timeout 110 python3 benchmarks/gpu_selection.py --out "$OUT" > "$OUT/selection.log" 2>&1
echo "selection rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|MATCHED|NOT|first result .* ms: the miss|largest excess|model accuracy" "$OUT/selection.log" | cut -c1-300
