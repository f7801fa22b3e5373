#!/usr/bin/env bash
# run S1: counter-log tests + benchmark, the fast-path tests, generate()
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 ADAPTIVE_CACHE_DIR=/tmp/adaptive-gpu-check-cache
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,utilization.gpu --format=csv,noheader
t0=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider -s tests/gpu/test_counterlog_cuda.py tests/gpu/test_integration_fast_paths_cuda.py > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"
grep -E "^(FAILED|ERROR)|passed|failed|^E  |governor:|handover" "$OUT/tests.log" | cut -c1-400 | head -40
t0=$SECONDS
timeout 170 python3 benchmarks/gpu_counterlog.py --out /tmp/cl > "$OUT/counterlog.log" 2>&1
echo "counterlog rc=$? $((SECONDS-t0)) s"
cp /tmp/cl/gpu_counterlog.json "$OUT/" 2>/dev/null
grep -A40 "throughput side by side" "$OUT/counterlog.log" | cut -c1-330
t0=$SECONDS
timeout 250 python3 benchmarks/gpu_generate.py --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/*.json "$OUT/" 2>/dev/null
tail -45 "$OUT/generate.log" | cut -c1-300
