#!/usr/bin/env bash
# run S40: generate() with every candidate, the rounds and two lockstep rounds (both
# models' generate() on each request at once, turn by turn: S38/S39's request-by-request
# rounds swung 0.90-1.13x between runs with the host's slow phases); then, in what time
# is left, the same with torch's calls only (one round, one lockstep round)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 380 python3 benchmarks/gpu_generate.py --no-ablation --lockstep-rounds 2 --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json "$OUT/" 2>/dev/null
grep -E "warm-up [0-9]|tokens/s|p50 / p99|greedy|committed choices|lockstep|ratio" "$OUT/generate.log" | cut -c1-260
left=$((545 - SECONDS))
if [ $left -gt 200 ]; then
  t0=$SECONDS
  timeout $left python3 benchmarks/gpu_generate.py --no-ablation --library-only --rounds 1 --lockstep-rounds 1 --out /tmp/genlib > "$OUT/generate_library.log" 2>&1
  echo "generate (library only) rc=$? $((SECONDS-t0)) s"
  cp /tmp/genlib/gpu_generate.json "$OUT/gpu_generate_library.json" 2>/dev/null
  grep -E "warm-up [0-9]|lockstep|ratio" "$OUT/generate_library.log" | cut -c1-260
else
  echo "generate (library only) not started: $left s left"
fi
