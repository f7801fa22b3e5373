#!/usr/bin/env bash
# run S58: the main job's mixed workload on the H200 (issue 14: "the mixed table's
# adaptive-steady/oracle below best-fixed/oracle for every op"; measured on the host only
# since the 30-calls-an-input stream, 34ec337), on the shipped pack of S47
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 300 python3 -m adaptive.cli bench mixed --backend cuda > "$OUT/bench_mixed.log" 2>&1
echo "bench mixed rc=$? $((SECONDS-t0)) s"
tail -25 "$OUT/bench_mixed.log" | cut -c1-240
