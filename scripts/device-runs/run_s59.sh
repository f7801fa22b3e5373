#!/usr/bin/env bash
# run S59: the contention run on S47's pack (S55's ran on the old pack with the new cuBLAS
# code, so the pack's cuBLAS rows were ignored), then the main job's mixed workload if time holds
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 120 python3 benchmarks/gpu_contention.py --out "$OUT" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"
tail -9 "$OUT/contention.log"
t0=$SECONDS
timeout 170 python3 -m adaptive.cli bench mixed --backend cuda > "$OUT/bench_mixed.log" 2>&1
echo "bench mixed rc=$? $((SECONDS-t0)) s"
tail -25 "$OUT/bench_mixed.log" | cut -c1-240
