#!/usr/bin/env bash
# run S101 (at most about 330 s, a fresh machine): issue 13's 2:4 dispatcher bar after 6ff58b0
# (a class reusing plans of candidates the benchmark had timed pinned now gets their samples:
# S100's every N <= 64 class explored 600 calls) and c2ff818 (both 2:4 baselines, dense and
# cuSPARSELt, anchored), every token count, a class still exploring printed with its samples
# and the event ring's state; then selection once (the anchoring change must leave issue 14's
# streams where S98 read them: 1.012 / 1.004 / 1.019)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 230 python3 benchmarks/gpu_sparse24.py --budget-s 190 --out "$OUT" > "$OUT/sparse24.log" 2>&1
echo "sparse24 rc=$? $((SECONDS-t0)) s"; grep -E "^  why|chosen" "$OUT/sparse24.log" | cut -c1-1200 | head -50; tail -10 "$OUT/sparse24.log" | cut -c1-200
selection 90
