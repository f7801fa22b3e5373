#!/usr/bin/env bash
# run S49 (after S46-S48): the dense headline with every mode's server up at once and each
# load served in two windows by both modes in turn (S29: one window a mode, torch's first
# batches stepped at 52 ms against 17.8 in its second: the host's phase, not the modes),
# two requests a client; the adaptive server now decides decode attention's classes up to
# the context before it listens (S29's spikes: classes at 608-861 keys explored under load)
# The kernel cache is filled first, as a deployment's is (torch's kernels come compiled in
# its wheel): S29's adaptive x8 stepped at 64-95 ms on 9 steps where new attention classes
# were explored, on a fresh machine whose cache held only what the warm-up had compiled
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 90 python3 -m adaptive.cli nvrtc-check --workers 15 --quiet > "$OUT/nvrtc.log" 2>&1
echo "nvrtc rc=$? $((SECONDS-t0)) s"; tail -1 "$OUT/nvrtc.log"
t0=$SECONDS
timeout 510 python3 benchmarks/gpu_headline.py --case dense --out "$OUT" > "$OUT/headline_dense.log" 2>&1
echo "headline dense rc=$? $((SECONDS-t0)) s"
grep -E "serving after|pooled|engine:|policy:|prefill profile: batch" "$OUT/headline_dense.log" | cut -c1-240
tail -6 "$OUT/headline_dense.log" | cut -c1-300
