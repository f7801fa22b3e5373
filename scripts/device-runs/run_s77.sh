#!/usr/bin/env bash
# run S77: generate() with library kernels only, its profile comparison now in the order
# torch, adaptive, adaptive, torch (S74 profiled each mode once, torch first, and read
# adaptive 28% faster in wall on the same kernels and calls: the order, not adaptive),
# and its batch-1 ablation with a mode that pauses the decode-steps hook (7c55959: the
# hook's share of the gap, side by side); then the main job's mixed workload (S75:
# rmsnorm 1.079 against best-fixed 1.030)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 420 python3 benchmarks/gpu_generate.py --library-only --rounds 1 --lockstep-rounds 2 --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json "$OUT/" 2>/dev/null
grep -E "ratio|ablation \(lockstep\)|profile batch|^    .* host +[+-][0-9.]+ ms \(calls" "$OUT/generate.log" | grep -v UserWarning | cut -c1-220
t0=$SECONDS
timeout 60 python3 -m adaptive.cli bench mixed --backend cuda > "$OUT/bench_mixed.log" 2>&1
echo "bench mixed rc=$? $((SECONDS-t0)) s"
tail -8 "$OUT/bench_mixed.log" | cut -c1-240
