#!/usr/bin/env bash
# run S67: the selection after the refuted-ranking widening (S60: long-burst 1.094 against
# best-fixed 1.067, SDPA committed at B=1 H=8 L=2048 D=64 with the flash kernels never
# explored), the contention run and the main job's mixed workload on the same tree
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 130 python3 benchmarks/gpu_selection.py --out "$OUT" > "$OUT/selection.log" 2>&1
echo "selection rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|MATCHED|NOT|first result .* ms: the miss|largest excess|model accuracy|widened|tuning runs under" "$OUT/selection.log" | cut -c1-300
t0=$SECONDS
timeout 100 python3 benchmarks/gpu_contention.py --out "$OUT/contention" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"
tail -8 "$OUT/contention.log"
t0=$SECONDS
timeout 120 python3 -m adaptive.cli bench mixed --backend cuda > "$OUT/bench_mixed.log" 2>&1
echo "bench mixed rc=$? $((SECONDS-t0)) s"
tail -14 "$OUT/bench_mixed.log" | cut -c1-240
