#!/usr/bin/env bash
# run S6: CUPTI through ctypes (tests, the probe's two ctypes configurations, the counter-log
# benchmark), and the server with the batcher's wait
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 ADAPTIVE_CACHE_DIR=/tmp/adaptive-gpu-check-cache
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,utilization.gpu --format=csv,noheader
t0=$SECONDS
timeout 90 python3 -m pytest -q -p no:cacheprovider -s tests/gpu/test_counterlog_cuda.py tests/gpu/test_integration_fast_paths_cuda.py > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"
grep -E "^(FAILED|ERROR)|passed|failed|^E  |governor:|handover|logged median" "$OUT/tests.log" | cut -c1-500 | head -30
t0=$SECONDS
timeout 80 python3 benchmarks/probe_cupti_variants.py --variants activity,raw_all --timeout-s 70 --out "$OUT" > "$OUT/probe.log" 2>&1
echo "probe rc=$? $((SECONDS-t0)) s"
cut -c1-600 "$OUT/probe.log"
t0=$SECONDS
timeout 180 python3 benchmarks/gpu_counterlog.py --out "$OUT/cl" > "$OUT/counterlog.log" 2>&1
echo "counterlog rc=$? $((SECONDS-t0)) s"
grep -A40 "throughput side by side" "$OUT/counterlog.log" | cut -c1-330
t0=$SECONDS
timeout 235 python3 benchmarks/gpu_server.py --out /tmp/srv --modes torch,adaptive > "$OUT/server.log" 2>&1
echo "server rc=$? $((SECONDS-t0)) s"
cp /tmp/srv/*.json "$OUT/" 2>/dev/null
tail -22 "$OUT/server.log" | cut -c1-400
