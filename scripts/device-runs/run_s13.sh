#!/usr/bin/env bash
# run S13 (a later session): the headline (issue 13, item 4), dense and 2:4 cases: adaptive
# against the better plain-PyTorch way through the real client and the example server
source "$(dirname "$0")/setup.sh"
for case in dense 2:4; do
  t0=$SECONDS
  timeout 290 python3 benchmarks/gpu_headline.py --case $case --out "$OUT" > "$OUT/headline_${case/:/}.log" 2>&1
  echo "headline $case rc=$? $((SECONDS-t0)) s"
  tail -14 "$OUT/headline_${case/:/}.log" | cut -c1-300
done
