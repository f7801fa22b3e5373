#!/usr/bin/env bash
# run S98 (at most about 540 s, a fresh machine): selection with steady state priced in the
# live stream's regime (each call synchronised) and pipelined beside it (batches of 8),
# then issue 13's 2:4 dispatcher bar (benchmarks/gpu_sparse24.py: the dispatcher's choice
# against dense cuBLAS and cuSPARSELt at every token count, three MLP shapes; last run S7/S8),
# then selection again on another seed (how far the streams swing)
source "$(dirname "$0")/setup.sh"
selection 170
cp "$OUT/selection.log" "$OUT/selection_seed0.log"; cp "$OUT/gpu_selection.json" "$OUT/gpu_selection_seed0.json"
t0=$SECONDS
timeout 200 python3 benchmarks/gpu_sparse24.py --budget-s 150 --out "$OUT" > "$OUT/sparse24.log" 2>&1
echo "sparse24 rc=$? $((SECONDS-t0)) s"; tail -24 "$OUT/sparse24.log" | cut -c1-220
selection 160 --seed 1
