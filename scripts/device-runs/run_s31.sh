#!/usr/bin/env bash
# run S31 (sixth session): S30's probe found no inflation of a warm library call's
# issuing behind the gate, so the policy's own exploration is probed (every sample it is
# given, on shapes the process has not run); and every SDPA call of adaptive's prefill
# (S30: 2 of 16 layers took SDPA's math path; S26's server prefill all 16)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 90 python3 benchmarks/probe_gated_issue.py > "$OUT/probe.log" 2>&1
echo "probe rc=$? $((SECONDS-t0)) s"; grep -A3 "^explored" "$OUT/probe.log" | cut -c1-900
t0=$SECONDS
timeout 150 python3 benchmarks/gpu_prefill.py --cases 16x1024 --rounds 3 --out "$OUT" > "$OUT/prefill.log" 2>&1
echo "prefill rc=$? $((SECONDS-t0)) s"
grep -E "adaptive/torch|call\(s\)|flash|efficient|cudnn|bmm|f32f32" "$OUT/prefill.log" | grep -v "^\[W" | cut -c1-400 | head -40
