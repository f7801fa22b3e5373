#!/usr/bin/env bash
# run S27 (next session, after S26): the counter-log GPU tests and the counter log after the hot-path and governor work
# (S23: host-bound events +9.15% against 10%; CUPTI governed +39.67% host-bound against the
# process before CUPTI: the governed mode now enables CUPTI only where it fits, measured
# in the first phase, before CUPTI is ever enabled; a fresh process's off rate after)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_counterlog_cuda.py > "$OUT/counterlog_tests.log" 2>&1
echo "counterlog tests rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/counterlog_tests.log"
t0=$SECONDS
timeout 240 python3 benchmarks/gpu_counterlog.py --out /tmp/cl > "$OUT/counterlog.log" 2>&1
echo "counterlog rc=$? $((SECONDS-t0)) s"
cp /tmp/cl/gpu_counterlog.json "$OUT/" 2>/dev/null
grep -A30 "throughput side by side" "$OUT/counterlog.log" | grep -v "logged within" | cut -c1-330
