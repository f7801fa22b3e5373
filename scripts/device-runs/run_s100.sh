#!/usr/bin/env bash
# run S100 (at most about 150 s, a fresh machine; written to fit a session's last 250 s of
# device time): the 2:4 dispatcher at the token counts where S99's choices fell short,
# each input's warm-up up to 8 s, the class's whole history (every candidate's samples,
# why it committed) and the warm-up's calls and seconds in the log
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 140 python3 benchmarks/gpu_sparse24.py --tokens 1,16,64,256,2048 --budget-s 105 --out "$OUT" > "$OUT/sparse24.log" 2>&1
echo "sparse24 rc=$? $((SECONDS-t0)) s"; grep -E "^  why|chosen" "$OUT/sparse24.log" | cut -c1-900 | head -40; tail -10 "$OUT/sparse24.log" | cut -c1-200
