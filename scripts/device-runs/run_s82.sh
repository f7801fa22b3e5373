#!/usr/bin/env bash
# run S82: the dense headline with all three modes (S80 left torch with cuDNN on out to
# fit its call: adaptive 1.448x and 1.206x torch-nocudnn's tokens/s at 8 and 32 clients)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 560 python3 benchmarks/gpu_headline.py --case dense --out "$OUT" > "$OUT/headline_dense.log" 2>&1
echo "headline dense rc=$? $((SECONDS-t0)) s"
grep -E "serving after|pooled|profile: prefill: (batch|python)" "$OUT/headline_dense.log" | cut -c1-260
tail -12 "$OUT/headline_dense.log" | cut -c1-300
