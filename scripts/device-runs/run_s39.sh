#!/usr/bin/env bash
# run S39 (next session, after S38): the server on the same requests in both modes after
# 4ec4769, and generate() with torch's calls only (the parity case; S37: 0.944 / 0.942,
# one refit in its batch-1 ablation's slow row)
source "$(dirname "$0")/setup.sh"
serve_both 300
t0=$SECONDS
timeout 280 python3 benchmarks/gpu_generate.py --no-ablation --library-only --out /tmp/genlib > "$OUT/generate_library.log" 2>&1
echo "generate (library only) rc=$? $((SECONDS-t0)) s"
cp /tmp/genlib/gpu_generate.json "$OUT/gpu_generate_library.json" 2>/dev/null
grep -E "warm-up|tokens/s|p50 / p99|ratio" "$OUT/generate_library.log" | cut -c1-260
