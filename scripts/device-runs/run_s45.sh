#!/usr/bin/env bash
# run S45 (after S43, with what device time a session has left): generate() with torch's
# calls only after the norms committed to the model's own ops call its forward (S43: the
# held baseline plan cost 132 against 97 us a call; 0.91x tokens/s at batch 1), one round
# and one lockstep round
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 235 python3 benchmarks/gpu_generate.py --no-ablation --library-only --rounds 1 --lockstep-rounds 1 --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json /tmp/gen/generate_profile_*.txt "$OUT/" 2>/dev/null
grep -E "warm-up [0-9]|rounds batch|lockstep|ratio|tokens/s|greedy|committed" "$OUT/generate.log" | cut -c1-260
