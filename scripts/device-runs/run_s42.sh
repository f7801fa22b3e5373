#!/usr/bin/env bash
# run S42 (next session, first): generate() with every candidate, two rounds and two
# lockstep rounds (both models token by token in one thread, so the host's slow phases
# fall on both: S38's request-by-request ratios swung with them); per-request lockstep
# lines are printed as they come
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 420 python3 benchmarks/gpu_generate.py --no-ablation --lockstep-rounds 2 --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json /tmp/gen/generate_profile_*.txt "$OUT/" 2>/dev/null
grep -E "warm-up [0-9]|rounds batch|lockstep|ratio|tokens/s|greedy|committed" "$OUT/generate.log" | cut -c1-260
