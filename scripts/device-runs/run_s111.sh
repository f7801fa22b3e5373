#!/usr/bin/env bash
# run S111 (at most about 120 s, a fresh machine or after another run): the staged cuSPARSELt
# variant with kept plans (variants/spmm/cusparselt_plan.py): its GPU tests, then the probe
# against torch's 2:4 path (a plan built every call: 0.45-1.05 ms of host a call, S106) and
# dense, device time and an eager loop. If both pass, add it to the manifest and rerun the
# 2:4 bar (gpu_sparse24.py) and the 2:4 headline (run_s110.sh)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_spmm_cusparselt_plan_cuda.py > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"; tail -15 "$OUT/tests.log" | cut -c1-300
t0=$SECONDS
timeout 90 python3 benchmarks/probe_cusparselt_plan.py > "$OUT/probe.log" 2>&1
echo "probe rc=$? $((SECONDS-t0)) s"; cut -c1-220 "$OUT/probe.log" | tail -20
