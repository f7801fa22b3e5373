#!/usr/bin/env bash
# run S28 (next session, after S26/S27): the transformers integration's GPU tests, then
# generate() at batch 1 and 16 (issue 12's four bars, met once in S21; the attention
# integration now hands SDPA the prefill's views:
# its greedy-token check is the GPU's word on that), then the prefill side by side (S25:
# 1.05-1.06x torch with three copies a layer, since removed)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_transformers_cuda.py tests/gpu/test_integration_fast_paths_cuda.py > "$OUT/integration_tests.log" 2>&1
echo "integration tests rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/integration_tests.log"
t0=$SECONDS
timeout 240 python3 benchmarks/gpu_generate.py --no-ablation --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/*.json "$OUT/" 2>/dev/null
grep -E "ratio|committed choices|identical|tokens" "$OUT/generate.log" | cut -c1-200 | tail -14
t0=$SECONDS
timeout 120 python3 benchmarks/gpu_prefill.py --out "$OUT" > "$OUT/prefill.log" 2>&1
echo "prefill rc=$? $((SECONDS-t0)) s"
grep -E "^  rows|device total|^prefill" "$OUT/prefill.log" | cut -c1-200
