#!/usr/bin/env bash
# run S102 (at most about 150 s, after S101 on its machine): the main job's mixed table on
# the GPU (issue 14: adaptive-steady/oracle below best-fixed/oracle for every op; S87: spmm
# 1.447x the best fixed choice in the stream's wall, its cublas_dense samples read 1.81 ms
# live against 0.0607 in the table), the stream also run whole three ways
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 140 python3 -m adaptive.cli bench mixed --backend cuda > "$OUT/bench_mixed.log" 2>&1
echo "bench mixed rc=$? $((SECONDS-t0)) s"
grep -E "^mixed |^all ops|wall ms|largest excess|^[a-z]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$" "$OUT/bench_mixed.log" | cut -c1-400
