#!/usr/bin/env bash
# run S7: counter-log tests (flush every 0.25 s, clocks warmed), the 2:4 streaming kernel's
# tests and benchmark, the counter-log benchmark in two phases, the contention run
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 ADAPTIVE_CACHE_DIR=/tmp/adaptive-gpu-check-cache
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,utilization.gpu --format=csv,noheader
t0=$SECONDS
timeout 80 python3 -m pytest -q -p no:cacheprovider -s tests/gpu/test_counterlog_cuda.py tests/gpu/test_integration_fast_paths_cuda.py > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"
grep -E "^(FAILED|ERROR)|passed|failed|^E  |governor:|handover|logged median" "$OUT/tests.log" | cut -c1-400 | head -20
t0=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_spmm_24_cuda.py > "$OUT/tests24.log" 2>&1
echo "tests24 rc=$? $((SECONDS-t0)) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests24.log" | cut -c1-300 | head -20
t0=$SECONDS
timeout 110 python3 benchmarks/gpu_sparse24.py --tokens 1,16,64 --budget-s 90 --out "$OUT" > "$OUT/sparse24.log" 2>&1
echo "sparse24 rc=$? $((SECONDS-t0)) s"
tail -32 "$OUT/sparse24.log" | cut -c1-300
t0=$SECONDS
timeout 150 python3 benchmarks/gpu_counterlog.py --out "$OUT/cl" > "$OUT/counterlog.log" 2>&1
echo "counterlog rc=$? $((SECONDS-t0)) s"
grep -A30 "throughput side by side" "$OUT/counterlog.log" | grep -v "logged within" | cut -c1-330
t0=$SECONDS
timeout 170 python3 benchmarks/gpu_contention.py --out "$OUT" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"
tail -45 "$OUT/contention.log" | cut -c1-300
