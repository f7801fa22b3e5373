#!/usr/bin/env bash
# run S70: the selection with the first result's deciding split into the policy's decide
# and the listing (S68: deciding 4.54 / 2.76 / 5.30 ms against the 5 ms bar; the same
# decide takes 0.8-1.4 ms on the 2-core development machine), the contention run, and
# generate() with library kernels only (issue 12's batch-1 and batch-16 bars); the
# selection again with explore_fraction 0.25 (long-burst's tuning runs 16.5% in S68)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 120 python3 benchmarks/gpu_selection.py --out "$OUT" > "$OUT/selection.log" 2>&1
echo "selection rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|MATCHED|NOT|first result .* ms: the miss|first result by op|learned-[a-z]+: commits|model accuracy|tuning runs under" "$OUT/selection.log" | cut -c1-300
t0=$SECONDS   # the A/B of a smaller exploring share on keys of few candidates (the H200
mkdir -p "$OUT/frac25"   # corpus: attention 4.4 explored an input against 5.8, replay unchanged)
timeout 120 python3 benchmarks/gpu_selection.py --learned explore_fraction=0.25 --out "$OUT/frac25" > "$OUT/selection_frac25.log" 2>&1
echo "selection explore_fraction=0.25 rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|MATCHED|NOT|tuning runs under" "$OUT/selection_frac25.log" | cut -c1-300
t0=$SECONDS
timeout 80 python3 benchmarks/gpu_contention.py --out "$OUT/contention" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"; tail -8 "$OUT/contention.log"
t0=$SECONDS
timeout 300 python3 benchmarks/gpu_generate.py --library-only --rounds 1 --lockstep-rounds 2 --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json "$OUT/" 2>/dev/null
grep -E "ratio|ablation \(lockstep\):|profile" "$OUT/generate.log" | cut -c1-220
