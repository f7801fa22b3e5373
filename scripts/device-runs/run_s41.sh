#!/usr/bin/env bash
# run S41: the session's last ~300 s of device time: generate() with every candidate, one
# round and one lockstep round (S40's two lockstep rounds after two rounds ran past its
# 380 s limit); per-request lockstep lines are printed as they come
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout ${1:-280} python3 benchmarks/gpu_generate.py --no-ablation --rounds 1 --lockstep-rounds 1 --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json "$OUT/" 2>/dev/null
grep -E "warm-up [0-9]|rounds batch|lockstep|ratio|tokens/s" "$OUT/generate.log" | cut -c1-260
