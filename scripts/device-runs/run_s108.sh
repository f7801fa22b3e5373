#!/usr/bin/env bash
# run S108 (at most about 360 s, a fresh machine): selection after the far-input guard
# (Learned.far_distance: every variant's best competes for the variant slots where the
# nearest measured input is beyond 3.5; S107's long-burst 1.065 was 1.5 ms of softmax
# 32768x4096 committed warp_row at 1.55x reg_row, never explored); the main job's mixed
# table under "sum" and under "regime" (S106, "sum": spmm's stream wall 1.41x the oracle
# against the best fixed choice's 0.995); the 2:4 bar and the contention bar under "regime"
source "$(dirname "$0")/setup.sh"
selection 110
for rule in sum regime; do
  t0=$SECONDS
  ADAPTIVE_ISSUE_CHARGE=$rule timeout 60 python3 -m adaptive.cli bench mixed --backend cuda > "$OUT/bench_mixed_$rule.log" 2>&1
  echo "bench mixed ($rule) rc=$? $((SECONDS-t0)) s"
  grep -E "^all ops|BEAT|MATCHED|NOT" "$OUT/bench_mixed_$rule.log" | cut -c1-200
done
t0=$SECONDS
ADAPTIVE_ISSUE_CHARGE=regime timeout 100 python3 benchmarks/gpu_sparse24.py --budget-s 70 --out "$OUT" > "$OUT/sparse24.log" 2>&1
echo "sparse24 (regime) rc=$? $((SECONDS-t0)) s"; sed -n '/^spmm 2:4, float16/,$p' "$OUT/sparse24.log" | cut -c1-200
t0=$SECONDS
timeout 90 python3 benchmarks/gpu_contention.py --issue-charge regime --out "$OUT/contention" > "$OUT/contention.log" 2>&1
echo "contention (regime) rc=$? $((SECONDS-t0)) s"; tail -10 "$OUT/contention.log" | cut -c1-300
