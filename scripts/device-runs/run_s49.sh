#!/usr/bin/env bash
# run S49 (after S46-S48): the dense headline with every mode's server up at once and each
# load served in two windows by both modes in turn (S29: one window a mode, torch's first
# batches stepped at 52 ms against 17.8 in its second: the host's phase, not the modes),
# two requests a client
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 540 python3 benchmarks/gpu_headline.py --case dense --out "$OUT" > "$OUT/headline_dense.log" 2>&1
echo "headline dense rc=$? $((SECONDS-t0)) s"
grep -E "serving after|pooled|engine:|policy:|prefill profile: batch" "$OUT/headline_dense.log" | cut -c1-240
tail -6 "$OUT/headline_dense.log" | cut -c1-300
