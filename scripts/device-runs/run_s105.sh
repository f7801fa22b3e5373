#!/usr/bin/env bash
# run S105 (at most about 250 s, after S104 on its machine): issue 14's contention bar under
# the new default issuing charge "measured" (S74 met it under "sum": 1.046-1.081), then
# the 2:4 bar at N <= 64 a second time (the run-to-run spread of the commits)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 100 python3 benchmarks/gpu_contention.py --out "$OUT/contention" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"; tail -10 "$OUT/contention.log" | cut -c1-300
grep -h "geomean caller" "$OUT/contention.log"
t0=$SECONDS
timeout 120 python3 benchmarks/gpu_sparse24.py --tokens 1,16,64 --budget-s 100 --out "$OUT/s24b" > "$OUT/sparse24b.log" 2>&1
echo "sparse24 (N <= 64) rc=$? $((SECONDS-t0)) s"; sed -n '/^spmm 2:4, float16/,$p' "$OUT/sparse24b.log" | cut -c1-220
