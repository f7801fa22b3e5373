#!/usr/bin/env bash
# run S36: where generate()'s 0.89x (run S34) goes. The host cost per call of decode
# attention held as SDPA against our split-KV kernel, and a miss per new Lk of each
# (gpu_hostpath), then generate() with adaptive's candidates torch's own calls only
# (cuBLAS, SDPA: the same library kernels in both modes, issue 12's parity case)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 90 python3 benchmarks/gpu_hostpath.py --out "$OUT" > "$OUT/hostpath.log" 2>&1
echo "hostpath rc=$? $((SECONDS-t0)) s"; cut -c1-200 "$OUT/hostpath.log"
t0=$SECONDS
timeout 320 python3 benchmarks/gpu_generate.py --no-ablation --library-only --out /tmp/gen > "$OUT/generate_library.log" 2>&1
echo "generate (library only) rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json "$OUT/gpu_generate_library.json" 2>/dev/null
grep -E "library only|warm-up|tokens/s|p50 / p99|greedy|committed choices|ratio|profile" "$OUT/generate_library.log" | cut -c1-260
