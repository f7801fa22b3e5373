#!/usr/bin/env bash
# run S76: the 2:4 headline again, to find where its prefills' seconds go (S73: at 32
# clients adaptive's time to a batch's first tokens was 1.2-7.5 s against 47-481 ms in
# torch-nocudnn, with no exploring call, commit or refit in the load, and a miss log of
# decode-attention class misses only). Since 48fd59b the per-batch lines give each
# prefill's CPU time (the engine thread's and the process's) and the misses inside it by
# kind, and decided misses are kept apart from class misses
source "$(dirname "$0")/setup.sh"
nvrtc_check 60
t0=$SECONDS
timeout 510 python3 benchmarks/gpu_headline.py --case 2:4 --modes torch-nocudnn,adaptive --out "$OUT" > "$OUT/headline_24.log" 2>&1
echo "headline 2:4 rc=$? $((SECONDS-t0)) s"
grep -E "serving after|FAILED|pooled|engine:|misses:|    batch [0-9]+:" "$OUT/headline_24.log" | cut -c1-330
tail -9 "$OUT/headline_24.log" | cut -c1-300
