#!/usr/bin/env bash
# run S4: the counter-log GPU tests after the widening fix and "auto" = events
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 ADAPTIVE_CACHE_DIR=/tmp/adaptive-gpu-check-cache
mkdir -p "$OUT"
t0=$SECONDS
timeout 120 python3 -m pytest -q -p no:cacheprovider -s tests/gpu/test_counterlog_cuda.py tests/gpu/test_integration_fast_paths_cuda.py > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"
grep -E "^(FAILED|ERROR)|passed|failed|^E  |governor:|handover|logged median" "$OUT/tests.log" | cut -c1-600 | head -40
