#!/usr/bin/env bash
# run S71: the bsr10 headline with room for its adaptive warm-up (S65: cut at 330 s; the
# adaptive server took 166 s to serve, 104 s of warm-up in 5 rounds)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 500 python3 benchmarks/gpu_headline.py --case bsr10 --out "$OUT" > "$OUT/headline_bsr10.log" 2>&1
echo "headline bsr10 rc=$? $((SECONDS-t0)) s"
grep -E "serving after|pooled|engine:|profile: (prefill|decode step 8): (batch|route|.*aten::copy_)" "$OUT/headline_bsr10.log" | cut -c1-220
tail -8 "$OUT/headline_bsr10.log" | cut -c1-300
