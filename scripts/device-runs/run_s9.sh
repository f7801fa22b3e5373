#!/usr/bin/env bash
# run S9: splitkv2_mma after the merge's alignment fix: its GPU tests and the decode
# benchmark on the shapes issue 13 asks 1.3x SDPA for (kernel cache filled first)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 ADAPTIVE_CACHE_DIR=/tmp/adaptive-gpu-check-cache
mkdir -p "$OUT"
t0=$SECONDS
timeout 50 python3 -m adaptive.cli nvrtc-check --op attention --workers 15 --quiet > "$OUT/nvrtc.log" 2>&1
echo "nvrtc rc=$? $((SECONDS-t0)) s"; tail -2 "$OUT/nvrtc.log"
t0=$SECONDS
timeout 70 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention_splitkv_cuda.py -k splitkv2 > "$OUT/tests_kv2.log" 2>&1
echo "splitkv2 tests rc=$? $((SECONDS-t0)) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_kv2.log" | cut -c1-300 | head -12
t0=$SECONDS
timeout 105 python3 benchmarks/gpu_decode_attention.py --out "$OUT" --shapes "gqa B=1 Lk=1024,gqa B=1 Lk=4096,gqa B=1 Lk=8192,gqa B=1 Lq=16" > "$OUT/decode.log" 2>&1
echo "decode rc=$? $((SECONDS-t0)) s"
grep -E ": sdpa|MET|NOT|gqa" "$OUT/decode.log" | cut -c1-300 | tail -24
