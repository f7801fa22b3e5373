#!/usr/bin/env bash
# run S56: the pruned headline cases (issue 13 (b)), each against the better of the plain
# ways with cuDNN's SDPA off (S51: with it on, torch's masked decode stepped 3.8-4.8x
# slower): 2:4 (torch-nocudnn dense on the pruned weights, torch24-nocudnn cuSPARSELt),
# then bsr10 (torch-nocudnn)
source "$(dirname "$0")/setup.sh"
for case in 2:4 bsr10; do
  t0=$SECONDS
  timeout 280 python3 benchmarks/gpu_headline.py --case $case --out "$OUT" > "$OUT/headline_${case/:/}.log" 2>&1
  echo "headline $case rc=$? $((SECONDS-t0)) s"
  grep -E "serving after|pooled|engine:" "$OUT/headline_${case/:/}.log" | cut -c1-220
  tail -6 "$OUT/headline_${case/:/}.log" | cut -c1-300
done
