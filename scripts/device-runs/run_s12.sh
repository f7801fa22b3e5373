#!/usr/bin/env bash
# run S12 (next session): issue 13's kernels measured whole: every decode shape, the 2:4
# weights at every token count, BSR at 10% blocks (kernel cache filled by 14 workers first)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 120 python3 -m adaptive.cli nvrtc-check --workers 15 --quiet > "$OUT/nvrtc.log" 2>&1
echo "nvrtc rc=$? $((SECONDS-t0)) s"; tail -2 "$OUT/nvrtc.log"
t0=$SECONDS
timeout 200 python3 benchmarks/gpu_decode_attention.py --out "$OUT" > "$OUT/decode.log" 2>&1
echo "decode rc=$? $((SECONDS-t0)) s"
grep -E "MET|NOT" "$OUT/decode.log" | cut -c1-200
t0=$SECONDS
timeout 170 python3 benchmarks/gpu_sparse24.py --budget-s 150 --out "$OUT" > "$OUT/sparse24.log" 2>&1
echo "sparse24 rc=$? $((SECONDS-t0)) s"
grep -E "^ +[0-9]+x|met\]" "$OUT/sparse24.log" | cut -c1-260
t0=$SECONDS
timeout 60 python3 benchmarks/gpu_spmm_mlp.py --cases bsr10 --budget-s 50 --out "$OUT" > "$OUT/spmm_mlp.log" 2>&1
echo "spmm_mlp rc=$? $((SECONDS-t0)) s"
grep -E "met\]" "$OUT/spmm_mlp.log" | cut -c1-200
