#!/usr/bin/env bash
# run S69 (first of the next session): the integration's GPU tests, two of them new: a
# kernel for a weight kept as given racing F.linear with its copies, and a sparse layer
# held on cuSPARSELt taking x as given (its transposed view in, the output transpose
# fused; S66's 2:4 prefill made 233 copies, 16.1 ms, against torch's 139 and 1.7 ms).
# Then the 2:4 headline against dense torch on the pruned weights (S66: 0.849x at 8
# clients, 0.988x at 32), a decode step of the profiled batch profiled too
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_integration_fast_paths_cuda.py > "$OUT/tests.log" 2>&1
rc=$?
echo "tests rc=$rc $((SECONDS-t0)) s"; grep -E "passed|failed|Error" "$OUT/tests.log" | tail -4 | cut -c1-300
if [ $rc -ne 0 ]; then   # the headline would serve through the failing routes: not run
  grep -E "^E |^FAILED" "$OUT/tests.log" | head -20 | cut -c1-300
  echo "headline 2:4 not run: the integration tests failed"; exit 1
fi
t0=$SECONDS
timeout 430 python3 benchmarks/gpu_headline.py --case 2:4 --modes torch-nocudnn,adaptive --out "$OUT" > "$OUT/headline_24.log" 2>&1
echo "headline 2:4 rc=$? $((SECONDS-t0)) s"
grep -E "serving after|pooled|engine:|profile: (prefill|decode step 8): (batch|route)" "$OUT/headline_24.log" | cut -c1-220
tail -9 "$OUT/headline_24.log" | cut -c1-300
