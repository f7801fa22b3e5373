#!/usr/bin/env bash
# run S46 (next session, FIRST): generate() with torch's calls only (cuBLAS, SDPA, the
# model's own norm ops), one round, two lockstep rounds, then the batch-1 ablation in
# lockstep (each switch's tokens/s as a ratio to torch's, every mode's step of each token
# in turn): which of routing, sampling, refits, the attention function or the norms
# makes S43/S45's 0.92-0.95x at batch 1
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 430 python3 benchmarks/gpu_generate.py --library-only --rounds 1 --lockstep-rounds 2 --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json /tmp/gen/generate_profile_*.txt "$OUT/" 2>/dev/null
grep -E "warm-up [0-9]|rounds batch|lockstep|ablation \(lockstep\)|ratio|tokens/s|committed" "$OUT/generate.log" | grep -v "^  lockstep request" | cut -c1-260
