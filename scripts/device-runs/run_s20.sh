#!/usr/bin/env bash
# run S20 (a later call, after S17's pack is copied to adaptive/packs/): issue 14's main job
# on the H200 (gpu_selection.py, last run P on 2026-12-01) and issue 13's dense headline
# through the server with Nagle's algorithm off (ab3c59b)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 200 python3 benchmarks/gpu_selection.py --out "$OUT" > "$OUT/selection.log" 2>&1
echo "selection rc=$? $((SECONDS-t0)) s"
tail -24 "$OUT/selection.log" | cut -c1-300
t0=$SECONDS
timeout 290 python3 benchmarks/gpu_headline.py --case dense --out "$OUT" > "$OUT/headline_dense.log" 2>&1
echo "headline dense rc=$? $((SECONDS-t0)) s"
tail -14 "$OUT/headline_dense.log" | cut -c1-300
