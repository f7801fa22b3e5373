#!/usr/bin/env bash
# run S17 (next session, first): the shipped pack rebuilt whole with gated timing (run S16's
# 190 s deadline left 36 of 124 cases; run S10 built all 124 in 239 s on a warm kernel
# cache), then the contention benchmark with its gated oracle (issue 14)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 70 python3 -m adaptive.cli nvrtc-check --workers 15 --quiet > "$OUT/nvrtc.log" 2>&1
echo "nvrtc rc=$? $((SECONDS-t0)) s"; tail -1 "$OUT/nvrtc.log"
t0=$SECONDS
timeout 330 python3 benchmarks/gpu_pack.py --deadline-s 295 --out /tmp/packout > "$OUT/pack.log" 2>&1
echo "pack rc=$? $((SECONDS-t0)) s"
tail -2 "$OUT/pack.log" | cut -c1-300
cp /tmp/packout/h200.msgpack /tmp/packout/gpu_pack.json "$OUT/" && cp /tmp/packout/h200.msgpack adaptive/packs/h200.msgpack
t0=$SECONDS
timeout 120 python3 benchmarks/gpu_contention.py --out "$OUT" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"
tail -12 "$OUT/contention.log" | cut -c1-300
