#!/usr/bin/env bash
# run S51: the dense headline with both plain-PyTorch ways a user could run: torch as built
# and torch with cuDNN's SDPA backend off (S49: torch's masked decode steps took 49-52 ms,
# 11.8 on the one batch whose key lengths an earlier batch had met: cuDNN builds a graph
# for each new key length), adaptive against the better of the two; then the contention
# run (issue 14)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 60 python3 -m adaptive.cli nvrtc-check --workers 15 --quiet > "$OUT/nvrtc.log" 2>&1
echo "nvrtc rc=$? $((SECONDS-t0)) s"; tail -1 "$OUT/nvrtc.log"
t0=$SECONDS
timeout 420 python3 benchmarks/gpu_headline.py --case dense --out "$OUT" > "$OUT/headline_dense.log" 2>&1
echo "headline dense rc=$? $((SECONDS-t0)) s"
grep -E "serving after|pooled|engine:|policy:|prefill profile: batch" "$OUT/headline_dense.log" | cut -c1-240
tail -8 "$OUT/headline_dense.log" | cut -c1-300
t0=$SECONDS
timeout 110 python3 benchmarks/gpu_contention.py --out "$OUT" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"
tail -12 "$OUT/contention.log" | cut -c1-300
