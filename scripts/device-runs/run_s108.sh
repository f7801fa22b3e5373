#!/usr/bin/env bash
# run S108 (at most about 330 s, after S107 on its machine): the main job's mixed table under
# "sum" and under "regime" (S106, "sum": spmm's stream wall 1.41x the oracle against the
# best fixed choice's 0.995), the 2:4 bar under "regime", and the contention bar under
# "regime" (S74 met it under "sum")
source "$(dirname "$0")/setup.sh"
for rule in sum regime; do
  t0=$SECONDS
  ADAPTIVE_ISSUE_CHARGE=$rule timeout 60 python3 -m adaptive.cli bench mixed --backend cuda > "$OUT/bench_mixed_$rule.log" 2>&1
  echo "bench mixed ($rule) rc=$? $((SECONDS-t0)) s"
  grep -E "^all ops|BEAT|MATCHED|NOT" "$OUT/bench_mixed_$rule.log" | cut -c1-200
done
t0=$SECONDS
ADAPTIVE_ISSUE_CHARGE=regime timeout 110 python3 benchmarks/gpu_sparse24.py --budget-s 80 --out "$OUT" > "$OUT/sparse24.log" 2>&1
echo "sparse24 (regime) rc=$? $((SECONDS-t0)) s"; sed -n '/^spmm 2:4, float16/,$p' "$OUT/sparse24.log" | cut -c1-200
t0=$SECONDS
timeout 100 python3 benchmarks/gpu_contention.py --issue-charge regime --out "$OUT/contention" > "$OUT/contention.log" 2>&1
echo "contention (regime) rc=$? $((SECONDS-t0)) s"; tail -10 "$OUT/contention.log" | cut -c1-300
