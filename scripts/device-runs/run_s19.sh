#!/usr/bin/env bash
# run S19 (next session, after S17 and S18): issue 15's CUPTI detach after the handover
# (b574ce3) in the counter-log GPU tests and gpu_counterlog.py (host-bound CUPTI governed
# was +36.9% in run S7), then generate() on S17's pack (issue 12)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 80 python3 -m pytest -q -p no:cacheprovider -s tests/gpu/test_counterlog_cuda.py tests/gpu/test_integration_fast_paths_cuda.py > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"
grep -E "^(FAILED|ERROR)|passed|failed|^E  |governor:" "$OUT/tests.log" | cut -c1-400 | head -16
t0=$SECONDS
timeout 150 python3 benchmarks/gpu_counterlog.py --out "$OUT/cl" > "$OUT/counterlog.log" 2>&1
echo "counterlog rc=$? $((SECONDS-t0)) s"
grep -A30 "throughput side by side" "$OUT/counterlog.log" | grep -v "logged within" | cut -c1-330
t0=$SECONDS
timeout 270 python3 benchmarks/gpu_generate.py --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/*.json "$OUT/" 2>/dev/null
tail -12 "$OUT/generate.log" | cut -c1-300
