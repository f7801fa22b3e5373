#!/usr/bin/env bash
# run S17 (next session, first): the shipped pack rebuilt whole with gated timing (run S16's
# 190 s deadline left 36 of 124 cases; run S10 built all 124 in 239 s on a warm kernel
# cache), then the contention benchmark with its gated oracle and the Learned policy's
# slots for other variants (dbe1081: softmax 2048x4096 now explores reg_row_cs; issue 14)
source "$(dirname "$0")/setup.sh"
build_pack 295
t0=$SECONDS
timeout 120 python3 benchmarks/gpu_contention.py --out "$OUT" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"
tail -12 "$OUT/contention.log" | cut -c1-300
