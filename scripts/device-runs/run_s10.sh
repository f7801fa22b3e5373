#!/usr/bin/env bash
# run S10 (the next session's first): what this session's device time did not reach.
# The counter-log and fast-path GPU tests, the contention run with the oracle timed
# cold (gpu_contention.py), the shipped pack rebuilt with every current variant (issue 14),
# then generate() and the server on the rebuilt pack (issue 12).
source "$(dirname "$0")/setup.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,utilization.gpu --format=csv,noheader
(timeout 80 python3 -m adaptive.cli nvrtc-check --workers 14 --quiet > "$OUT/nvrtc.log" 2>&1; echo "nvrtc rc=$?" >> "$OUT/nvrtc.log") &
t0=$SECONDS
timeout 80 python3 -m pytest -q -p no:cacheprovider -s tests/gpu/test_counterlog_cuda.py tests/gpu/test_integration_fast_paths_cuda.py > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"
grep -E "^(FAILED|ERROR)|passed|failed|^E  " "$OUT/tests.log" | cut -c1-500 | head -16
wait; tail -2 "$OUT/nvrtc.log"
t0=$SECONDS
timeout 120 python3 benchmarks/gpu_contention.py --out "$OUT" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"
tail -12 "$OUT/contention.log" | cut -c1-300
t0=$SECONDS
timeout 320 python3 benchmarks/gpu_pack.py --deadline-s 280 --out "$OUT" > "$OUT/pack.log" 2>&1
echo "pack rc=$? $((SECONDS-t0)) s"
tail -8 "$OUT/pack.log" | cut -c1-300
