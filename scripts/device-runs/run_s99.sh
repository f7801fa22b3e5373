#!/usr/bin/env bash
# run S99 (at most about 250 s, a fresh machine): issue 13's 2:4 dispatcher bar again, the
# dispatcher started as adaptive.launch's is (the shipped pack) and warmed up as a server
# does (adaptive.unbounded_exploration); S98's warm-up under the exploration budget left
# dense cuBLAS on every input but one, cuSPARSELt (1.28-1.44x at N >= 512) untried
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 235 python3 benchmarks/gpu_sparse24.py --budget-s 170 --out "$OUT" > "$OUT/sparse24.log" 2>&1
echo "sparse24 rc=$? $((SECONDS-t0)) s"; grep -E "^  why|chosen" "$OUT/sparse24.log" | cut -c1-200 | head -50; tail -12 "$OUT/sparse24.log" | cut -c1-200
