#!/usr/bin/env bash
# run S62: the bsr10 headline again with a sparse layer on spmm's baseline served as
# F.linear (S56: adaptive's prefill made 131 copies, 14.0 ms, against torch's 1.75 ms;
# 8 clients 1.301x tokens/s, p99 0.852x)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 330 python3 benchmarks/gpu_headline.py --case bsr10 --out "$OUT" > "$OUT/headline_bsr10.log" 2>&1
echo "headline bsr10 rc=$? $((SECONDS-t0)) s"
grep -E "serving after|pooled|engine:|prefill profile: (batch|route|.*aten::copy_)" "$OUT/headline_bsr10.log" | cut -c1-220
tail -8 "$OUT/headline_bsr10.log" | cut -c1-300
