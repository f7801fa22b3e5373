#!/usr/bin/env bash
# run S34 (next session, after S33): generate() at batch 1 and 16 after the warm-up turn
# and the least issuing (S28: one gemm key committed tc_mma, batch 1 0.86x torch; S32 ran
# out of its 200 s: the warm-up took 108 s), the integration's GPU tests, and selection
# with the issuing charged by the class (S32: three_pass charged nothing, 2.4x the best)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 300 python3 benchmarks/gpu_generate.py --no-ablation --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/*.json "$OUT/" 2>/dev/null
grep -E "warm-up|tokens/s|p50 / p99|greedy|committed choices|ratio|profile" "$OUT/generate.log" | cut -c1-260
t0=$SECONDS
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_transformers_cuda.py tests/gpu/test_integration_fast_paths_cuda.py > "$OUT/integration_tests.log" 2>&1
echo "integration tests rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/integration_tests.log"
t0=$SECONDS
timeout 120 python3 benchmarks/gpu_selection.py --out "$OUT" > "$OUT/selection.log" 2>&1
echo "selection rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|MATCHED|NOT" "$OUT/selection.log" | cut -c1-300
