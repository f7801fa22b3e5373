#!/usr/bin/env bash
# run S50: generate() with torch's calls only after the routing backoff (a held plan's
# warm calls routed one in 64, then 128, 256, 512 while each routed call finds the same
# plan; S46's ablation: 0.939x torch with routing, 0.972x without), one round, two
# lockstep rounds and the batch-1 ablation; then the selection streams on the shipped pack
# with the policy's race (Learned.race_ratio, landed after S43's selection run)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 300 python3 benchmarks/gpu_generate.py --library-only --rounds 1 --lockstep-rounds 2 --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json "$OUT/" 2>/dev/null
grep -E "warm-up [0-9]|rounds batch|ablation \(lockstep\)|ratio|tokens/s|committed" "$OUT/generate.log" | grep -v "^  lockstep request\|^  b1 ablation" | cut -c1-220
t0=$SECONDS
timeout 120 python3 benchmarks/gpu_selection.py --out "$OUT" > "$OUT/selection.log" 2>&1
echo "selection rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|MATCHED|NOT|first result .* ms: the miss|largest excess|model accuracy|tuning" "$OUT/selection.log" | cut -c1-300
