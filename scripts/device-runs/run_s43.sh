#!/usr/bin/env bash
# run S43 (after S42), then the selection benchmark: generate() with torch's calls only (cuBLAS, SDPA), two rounds and two
# lockstep rounds (both models token by token in one thread, so the host's slow phases
# fall on both: S38's request-by-request ratios swung with them); per-request lockstep
# lines are printed as they come
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 420 python3 benchmarks/gpu_generate.py --no-ablation --library-only --lockstep-rounds 2 --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
mkdir -p "$OUT/lib"; cp /tmp/gen/gpu_generate.json /tmp/gen/generate_profile_*.txt "$OUT/lib/" 2>/dev/null
grep -E "warm-up [0-9]|rounds batch|lockstep|ratio|tokens/s|greedy|committed" "$OUT/generate.log" | cut -c1-260
# then the selection benchmark: each live policy's first result split into the miss
# (deciding, preparing) and the launch, tuning runs counted as exploring samples only,
# the cheaper decide (S34: first result 7.36 / 5.14 / 9.10 ms, tuning 6.2 / 16.4 / 7.6%)
t0=$SECONDS
timeout 120 python3 benchmarks/gpu_selection.py --out "$OUT" > "$OUT/selection.log" 2>&1
echo "selection rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|MATCHED|NOT|first result .* ms: the miss|tuning runs|largest excess" "$OUT/selection.log" | cut -c1-300
