#!/usr/bin/env bash
# run S57 (after S56, if the budget holds): the dense headline again with the warm-up on
# the engine's thread (torch's cuDNN attention graphs are per thread: S51's torch prefills
# of 8 rows took 53-64 ms with cuDNN, 20-26 without) and the greedy-token comparison
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 440 python3 benchmarks/gpu_headline.py --case dense --out "$OUT" > "$OUT/headline_dense.log" 2>&1
echo "headline dense rc=$? $((SECONDS-t0)) s"
grep -E "serving after|pooled|engine:" "$OUT/headline_dense.log" | cut -c1-220
tail -12 "$OUT/headline_dense.log" | cut -c1-300
