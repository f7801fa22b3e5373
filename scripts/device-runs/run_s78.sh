#!/usr/bin/env bash
# run S78 (the end of a session's budget, about 200 s): generate() with library kernels
# only, after the decode-steps hook (7c55959: a decode step makes the model's own calls
# directly, no per-layer Python; CPU: per token 0.972 -> 0.989 and 0.967 -> 0.999
# plain/patched), one round, one lockstep round, no ablation; the ratios come before
# the profile, so a cut run still has them (S74 without the hook: rounds b1 0.951,
# b16 0.872; lockstep b1 0.959, b16 0.954)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout "${1:-185}" python3 benchmarks/gpu_generate.py --library-only --rounds 1 --lockstep-rounds 1 --no-ablation --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
grep -E "warm-up|rounds batch|lockstep request|ratio|greedy|misses" "$OUT/generate.log" | grep -v UserWarning | cut -c1-200
