#!/usr/bin/env bash
# run S80: the dense headline (S57's) with the two modes that fit one call beside other
# runs: torch-nocudnn (the better plain mode: with cuDNN on, torch's masked decode stepped
# 3.8-4.8x slower, run S51) and adaptive; torch with cuDNN on is left out, and the report
# says so
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 420 python3 benchmarks/gpu_headline.py --case dense --modes torch-nocudnn,adaptive --out "$OUT" > "$OUT/headline_dense.log" 2>&1
echo "headline dense rc=$? $((SECONDS-t0)) s"
grep -E "serving after|pooled|engine:|    batch [0-9]+:" "$OUT/headline_dense.log" | cut -c1-260
tail -10 "$OUT/headline_dense.log" | cut -c1-300
