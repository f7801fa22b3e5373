#!/usr/bin/env bash
# run S37: generate() with adaptive's candidates torch's own calls only (the same library
# kernels in both modes; S36: batch 1 0.896x, batch 16 1.017x) and the batch-1 ablation:
# routing, sampling, refits switched off in turn, and adaptive's linears with
# transformers' own SDPA attention function (which part of the host path costs)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 330 python3 benchmarks/gpu_generate.py --library-only --out /tmp/gen > "$OUT/generate_library.log" 2>&1
echo "generate (library only, ablation) rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json "$OUT/gpu_generate_library.json" 2>/dev/null
cp /tmp/gen/generate_profile_*.txt "$OUT/" 2>/dev/null
grep -E "library only|warm-up|tokens/s|p50 / p99|greedy|committed choices|ratio|ablation|round" "$OUT/generate_library.log" | grep -v "batch 1 ablation:" | cut -c1-260
