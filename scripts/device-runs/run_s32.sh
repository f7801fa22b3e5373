#!/usr/bin/env bash
# run S32 (sixth session): the exploring samples after the warm-up turn and the least
# issuing (S31: cuBLAS's samples read its cold first call and its issuing while
# exploring, 3-7x its plain issuing, and our kernels were committed at 2-4x its time);
# the counter-log tests after the fixes of two stale tests; generate() (S28: one gemm
# key committed tc_mma, batch 1 0.86x torch) and selection
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_counterlog_cuda.py > "$OUT/counterlog_tests.log" 2>&1
echo "counterlog tests rc=$? $((SECONDS-t0)) s"; grep -E "^FAILED|passed|failed|^E  .*Assert" "$OUT/counterlog_tests.log" | cut -c1-300 | head -8
t0=$SECONDS
timeout 60 python3 benchmarks/probe_gated_issue.py > "$OUT/probe.log" 2>&1
echo "probe rc=$? $((SECONDS-t0)) s"; grep -A3 "^explored" "$OUT/probe.log" | cut -c1-700
t0=$SECONDS
timeout 200 python3 benchmarks/gpu_generate.py --no-ablation --out "$OUT" > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
grep -E "tokens/s|p50 / p99|greedy|committed choices|ratio|warm-up generates|profile" "$OUT/generate.log" | cut -c1-260
t0=$SECONDS
timeout 110 python3 benchmarks/gpu_selection.py --out "$OUT" > "$OUT/selection.log" 2>&1
echo "selection rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|MATCHED|NOT" "$OUT/selection.log" | cut -c1-300
