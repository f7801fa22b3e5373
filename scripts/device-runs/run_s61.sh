#!/usr/bin/env bash
# run S61: the 2:4 headline case alone (issue 13 (b)); S56 ran it with bsr10 in one call and
# it passed its 280 s with three modes (torch-nocudnn, torch24-nocudnn: 45 s to serve,
# adaptive) before the adaptive server served
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 540 python3 benchmarks/gpu_headline.py --case 2:4 --out "$OUT" > "$OUT/headline_24.log" 2>&1
echo "headline 2:4 rc=$? $((SECONDS-t0)) s"
grep -E "serving after|pooled|engine:|prefill profile: (batch|route)" "$OUT/headline_24.log" | cut -c1-220
tail -8 "$OUT/headline_24.log" | cut -c1-300
