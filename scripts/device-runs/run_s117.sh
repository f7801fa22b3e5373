#!/usr/bin/env bash
# run S117 (at most about 210 s, a fresh machine): the staged cuBLASLt variant with kept plans
# (variants/gemm/cublaslt_plan.py) and the kept-plan cuSPARSELt (its views at an offset now
# staged through its own aligned buffers): their GPU tests, and the counter log's (an
# exploration's untimed calls now reach the recorders as plain ones), then the probe against cublasGemmEx (the
# cublas variant: 35-42 us of host a call from CuPy in S116, against 18-21 us for our
# kernels) and torch.mm, device time and an eager loop. If both pass and the kept plan
# issues faster, it joins the manifest (next session: measured into the pack, then the
# contention bar and selection)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemm_cublaslt_plan_cuda.py tests/gpu/test_spmm_cusparselt_plan_cuda.py tests/gpu/test_counterlog_cuda.py > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"; tail -15 "$OUT/tests.log" | cut -c1-300
t0=$SECONDS
timeout 60 python3 benchmarks/probe_cublaslt_plan.py > "$OUT/probe.log" 2>&1
echo "probe rc=$? $((SECONDS-t0)) s"; cut -c1-220 "$OUT/probe.log" | tail -16
