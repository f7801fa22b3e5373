#!/usr/bin/env bash
# run S30 (sixth session): why library candidates' exploring samples read 3-8x their plain
# issuing (S26, S28), why adaptive's prefill of 16 x 1024 took 2.67x torch's (S28: SDPA's
# math path?), and the two GPU tests whose assertions were stale (a fixture whose start
# added the shipped pack's variants; a layout default)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 120 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_integration_fast_paths_cuda.py "tests/gpu/test_transformers_cuda.py::test_patched_tiny_llama_generates_the_same_greedy_tokens_fp16" > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/tests.log"
t0=$SECONDS
timeout 90 python3 benchmarks/probe_gated_issue.py > "$OUT/probe.log" 2>&1
echo "probe rc=$? $((SECONDS-t0)) s"; cut -c1-200 "$OUT/probe.log"
t0=$SECONDS
timeout 150 python3 benchmarks/gpu_prefill.py --cases 16x1024,8x1024 --rounds 3 --out "$OUT" > "$OUT/prefill.log" 2>&1
echo "prefill rc=$? $((SECONDS-t0)) s"
grep -vE "^\s*$|UserWarning|_warn_once" "$OUT/prefill.log" | grep -v "gemm {" | cut -c1-330 | head -60
