#!/usr/bin/env bash
# run S139 (at most about 500 s plus the start, a fresh machine): the session's last tree,
# every GPU bar of issue 14 once more with Python's fault handler on (S137's segmentation
# fault): selection, the mixed table, contention, then selection a second time (its bars
# sit near their thresholds from run to run: S122-S138)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
selection 170
mixed_table 150 w6
contention 110
mkdir -p "$OUT/second"
t0=$SECONDS
timeout 170 python3 benchmarks/gpu_selection.py --out "$OUT/second" > "$OUT/selection2.log" 2>&1
echo "selection (second) rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|NOT|first result .* ms: the miss|model accuracy" "$OUT/selection2.log" | grep -E "learned-shipped|steady/oracle over|accuracy|BEAT|NOT met" | cut -c1-260
