#!/usr/bin/env bash
# run S23 (next session, after S22): issue 13's dense headline through the server (never
# run on a GPU), then issue 15's counter-log overhead (S19: host-bound events +10.06%
# against 10%, GPU-bound CUPTI governed +3.52% against 3%)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 290 python3 benchmarks/gpu_headline.py --case dense --out "$OUT" > "$OUT/headline_dense.log" 2>&1
echo "headline dense rc=$? $((SECONDS-t0)) s"
tail -14 "$OUT/headline_dense.log" | cut -c1-300
t0=$SECONDS
timeout 150 python3 benchmarks/gpu_counterlog.py --out /tmp/cl > "$OUT/counterlog.log" 2>&1
echo "counterlog rc=$? $((SECONDS-t0)) s"
cp /tmp/cl/gpu_counterlog.json /tmp/cl/gpu_counterlog.png "$OUT/" 2>/dev/null
grep -A30 "throughput side by side" "$OUT/counterlog.log" | grep -v "logged within" | cut -c1-330
