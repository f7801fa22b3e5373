#!/usr/bin/env bash
# run S63: generate() with torch's calls only after the per-layer memo of a decode class
# held on SDPA (S55: lockstep batch 1 0.942, rounds 0.939 against the 0.98 bar; the
# ablation's row with transformers' own attention function 0.993), the batch-1 ablation in
# lockstep
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 300 python3 benchmarks/gpu_generate.py --library-only --rounds 1 --lockstep-rounds 2 --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json "$OUT/" 2>/dev/null
grep -E "warm-up [0-9]|threads while|rounds batch|ablation \(lockstep\)|ratio|committed|profile" "$OUT/generate.log" | grep -v "^  lockstep request\|^  b1 ablation" | cut -c1-220
