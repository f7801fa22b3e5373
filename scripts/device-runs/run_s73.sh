#!/usr/bin/env bash
# run S73: the 2:4 headline again (S69: the adaptive server was stopped by the benchmark's
# 240 s start limit after a 47.9 s sweep and a 91.6 s first warm-up round; the limit is
# now 150 s + 3x the warm-up limit), a decode step of the profiled batch profiled too.
# S66: 0.849x at 8 clients, 0.988x at 32, with 233 transposing copies in a prefill that
# the cuSPARSELt route taking x as given (GPU-tested in S69) removes
# The kernel cache is filled first (S69 ran without it: the adaptive server's sweep took
# 23.9 s for its first batch size, 3.8-8.3 s for each later one: most likely compiling)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 60 python3 -m adaptive.cli nvrtc-check --workers 15 --quiet > "$OUT/nvrtc.log" 2>&1
echo "nvrtc rc=$? $((SECONDS-t0)) s"; tail -1 "$OUT/nvrtc.log"
t0=$SECONDS
timeout 510 python3 benchmarks/gpu_headline.py --case 2:4 --modes torch-nocudnn,adaptive --out "$OUT" > "$OUT/headline_24.log" 2>&1
echo "headline 2:4 rc=$? $((SECONDS-t0)) s"
grep -E "serving after|FAILED|pooled|engine:|profile: (prefill|decode step 8): (batch|route|.*aten::copy_)" "$OUT/headline_24.log" | cut -c1-220
grep -E "warm-up round|swept|stopped" "$OUT/server-adaptive.log" | tail -6 | cut -c1-200
tail -9 "$OUT/headline_24.log" | cut -c1-300
