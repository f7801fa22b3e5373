#!/usr/bin/env bash
# run S48 (after S47, with S47's pack committed to adaptive/packs/): the contention
# benchmark (issue 14: steady/oracle with and without a co-running load, each <= 1.10),
# then generate() with every candidate, one round and one lockstep round (S42's bars met
# before the new pack)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 130 python3 benchmarks/gpu_contention.py --out "$OUT" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"
tail -12 "$OUT/contention.log" | cut -c1-300
t0=$SECONDS
timeout 400 python3 benchmarks/gpu_generate.py --no-ablation --rounds 1 --lockstep-rounds 1 --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json "$OUT/" 2>/dev/null
grep -E "warm-up [0-9]|ratio|committed" "$OUT/generate.log" | cut -c1-260
