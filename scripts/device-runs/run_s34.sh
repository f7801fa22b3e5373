#!/usr/bin/env bash
# run S34 (next session, after S33): generate() at batch 1 and 16 after the warm-up turn
# and the least issuing (S28: one gemm key committed tc_mma, batch 1 0.86x torch; S32 ran
# out of its 200 s: the warm-up took 108 s), then the integration's GPU tests
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 320 python3 benchmarks/gpu_generate.py --no-ablation --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/*.json "$OUT/" 2>/dev/null
grep -E "warm-up|tokens/s|p50 / p99|greedy|committed choices|ratio|profile" "$OUT/generate.log" | cut -c1-260
t0=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_transformers_cuda.py tests/gpu/test_integration_fast_paths_cuda.py > "$OUT/integration_tests.log" 2>&1
echo "integration tests rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/integration_tests.log"
