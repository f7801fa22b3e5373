#!/usr/bin/env bash
# run S8: the two tests run S7 failed (with their diagnostics), splitkv2_mma's GPU tests and
# decode benchmark (kernel cache filled first by 16 NVRTC workers), the 2:4 benchmark with
# the baseline anchor
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 ADAPTIVE_CACHE_DIR=/tmp/adaptive-gpu-check-cache
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,utilization.gpu --format=csv,noheader
(timeout 60 python3 -m adaptive.cli nvrtc-check --op attention --workers 14 --quiet > "$OUT/nvrtc.log" 2>&1; echo "nvrtc rc=$?" >> "$OUT/nvrtc.log") &
t0=$SECONDS
timeout 60 python3 -m pytest -q -p no:cacheprovider -s "tests/gpu/test_counterlog_cuda.py::test_a_governed_cupti_log_hands_over_to_events_without_losing_a_call" "tests/gpu/test_integration_fast_paths_cuda.py::test_a_patched_llama_holds_its_plans_and_generates_the_plain_tokens" > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"
grep -E "^(FAILED|ERROR)|passed|failed|^E  " "$OUT/tests.log" | cut -c1-700 | head -16
wait
tail -3 "$OUT/nvrtc.log"
t0=$SECONDS
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention_splitkv_cuda.py -k splitkv2 > "$OUT/tests_kv2.log" 2>&1
echo "splitkv2 tests rc=$? $((SECONDS-t0)) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_kv2.log" | cut -c1-300 | head -20
t0=$SECONDS
timeout 150 python3 benchmarks/gpu_decode_attention.py --out "$OUT" --shapes "gqa B=1 Lk=1024,gqa B=1 Lk=4096,gqa B=1 Lk=8192,gqa B=1 Lq=16,gqa B=1 Lq=4" > "$OUT/decode.log" 2>&1
echo "decode rc=$? $((SECONDS-t0)) s"
tail -30 "$OUT/decode.log" | cut -c1-260
t0=$SECONDS
timeout 85 python3 benchmarks/gpu_sparse24.py --tokens 1,16,64 --budget-s 60 --out "$OUT" > "$OUT/sparse24.log" 2>&1
echo "sparse24 rc=$? $((SECONDS-t0)) s"
grep -E "^ +[0-9]+x|targets|NOT met|\[met\]" "$OUT/sparse24.log" | cut -c1-260 | head -20
