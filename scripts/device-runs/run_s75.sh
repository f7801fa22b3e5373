#!/usr/bin/env bash
# run S75: the exploring share A/B on the rebuilt pack, each setting twice, alternating, so
# the run-to-run spread is measured beside the effect (S70 moved every row between two
# runs, best-fixed and measure-each included; S72's long-burst tuning runs were 14.6%
# against the 10% bar, S70's with explore_fraction 0.25 9.5%; the default since c99c775
# rotates only over candidates short of samples and stops timing one clear of the leader:
# replayed on the CPU, 14.9 -> 12.3% on the shipped pack's prefills; since f0b9aa0 no
# candidate is timed past its samples while they are harvested: S72's long-burst timed
# each of its 81 explored candidates 4 times of 3); then the contention run
# with issue_charge max (see the end)
source "$(dirname "$0")/setup.sh"
for i in 1 2; do
  for frac in default 0.25; do
    t0=$SECONDS; mkdir -p "$OUT/$frac-$i"
    extra=(); [ "$frac" = default ] || extra=(--learned "explore_fraction=$frac")
    timeout 110 python3 benchmarks/gpu_selection.py "${extra[@]}" --out "$OUT/$frac-$i" > "$OUT/$frac-$i/selection.log" 2>&1
    echo "selection $frac run $i rc=$? $((SECONDS-t0)) s"
    grep -E "^steady/oracle over|BEAT|MATCHED|NOT|tuning runs under|first result of a new key" "$OUT/$frac-$i/selection.log" | grep -v "learned-pack" | cut -c1-260
  done
done
t0=$SECONDS   # the main job's mixed workload on the rebuilt pack (S68: spmm 1.309 against
# best-fixed 1.231 and rmsnorm 1.121 against 1.011 were the ops not beaten)
timeout 60 python3 -m adaptive.cli bench mixed --backend cuda > /tmp/bench_mixed.log 2>&1
echo "bench mixed rc=$? $((SECONDS-t0)) s"
tail -12 /tmp/bench_mixed.log | cut -c1-240
# the contention run with a host-bound class charged the larger of device time and
# issuing: its loop issues a round's 7 calls back to back, one synchronise a round, where
# one call's issuing overlaps the device's run of the one before (S74 runs it with "sum")
t0=$SECONDS
timeout 80 python3 benchmarks/gpu_contention.py --issue-charge max --out "$OUT/contention_max" > "$OUT/contention_max.log" 2>&1
echo "contention (max) rc=$? $((SECONDS-t0)) s"; tail -8 "$OUT/contention_max.log"
grep -h "geomean caller" "$OUT/contention_max.log"
