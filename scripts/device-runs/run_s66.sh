#!/usr/bin/env bash
# run S66: the 2:4 headline with torch-nocudnn and adaptive only (S61 ran all three modes
# and was cut at 540 s: torch24-nocudnn served 84.6 against torch-nocudnn's 449.7 tokens/s
# at 8 clients and 135.8 against 822.1 at 32, so the better plain way is dense on the
# pruned weights), then SDPA's issuing from CuPy arrays in parts
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 430 python3 benchmarks/gpu_headline.py --case 2:4 --modes torch-nocudnn,adaptive --out "$OUT" > "$OUT/headline_24.log" 2>&1
echo "headline 2:4 rc=$? $((SECONDS-t0)) s"
grep -E "serving after|pooled|engine:|prefill profile: (batch|route)" "$OUT/headline_24.log" | cut -c1-220
tail -9 "$OUT/headline_24.log" | cut -c1-300
t0=$SECONDS
timeout 60 python3 benchmarks/gpu_hostpath.py --cases cupy-attention,cupy-sdpa-parts --out /tmp/hp > "$OUT/hostpath.log" 2>&1
echo "hostpath rc=$? $((SECONDS-t0)) s"; cat "$OUT/hostpath.log" | cut -c1-220
