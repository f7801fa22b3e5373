#!/usr/bin/env bash
# run S87 (after S86, on its machine: the kernel cache filled): the host path's cases with
# a class miss's parts profiled (a decode step's new key length: S81/S85's servers paid
# ~0.37 ms a step, 0.25 ms of it preparing the plan); `adaptive bench mixed` with the
# stream also run whole three ways (wall time, issuing included: S83's table priced cuBLAS
# from CuPy at 69 us a call against 8 us of device time); then generate() with library
# kernels only again, without the ablation (S84: lockstep 0.985 and 0.989, p99 1.013 and
# 1.018, bars met; its rounds swung 0.853-1.026: two rounds here, its batch-16 rounds one
# pass over 2 requests in S84)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 90 python3 benchmarks/gpu_hostpath.py --out "$OUT" > "$OUT/hostpath.log" 2>&1
echo "hostpath rc=$? $((SECONDS-t0)) s"
grep -E "new Lk|class miss" "$OUT/hostpath.log" | cut -c1-700
t0=$SECONDS
timeout 120 python3 -m adaptive.cli bench mixed --backend cuda > "$OUT/bench_mixed.log" 2>&1
echo "bench mixed rc=$? $((SECONDS-t0)) s"
grep -E "^mixed |^all ops|wall ms|^[a-z]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$" "$OUT/bench_mixed.log" | cut -c1-300
generate 340 --no-ablation --rounds 2
