#!/usr/bin/env bash
# run S83: the main job's mixed workload with its table timed interleaved, 3 calls a round
# (4bc0a1a, and the commit after it; S77
# priced attention's choices 1.549x the oracle where S75 read 1.002 on the same inputs)
# and the input each op's choices lost most on; then gpu_selection.py twice on the pack
# of S79 (S79: every issue-14 selection bar met but uniform-mix's first result, 5.44 ms)
source "$(dirname "$0")/setup.sh"
nvrtc_check 60   # the kernel cache filled first (1 s once filled)
t0=$SECONDS
timeout 90 python3 -m adaptive.cli bench mixed --backend cuda > "$OUT/bench_mixed.log" 2>&1
echo "bench mixed rc=$? $((SECONDS-t0)) s"
grep -E "^mixed |^all ops" "$OUT/bench_mixed.log" | cut -c1-300
selection 110
mv "$OUT/selection.log" "$OUT/selection1.log"; mv "$OUT/gpu_selection.json" "$OUT/gpu_selection1.json"
selection 110
