#!/usr/bin/env bash
# run S140 (at most about 380 s plus the start, a fresh machine): the session's last tree,
# with a miss's listing 2-4x faster (Variant.fitting filtered by requirement, bd78d00):
# selection twice (first results against S137-S139's), the mixed table, contention, the
# fault handler on
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
selection 170
mkdir -p "$OUT/second"
t0=$SECONDS
timeout 170 python3 benchmarks/gpu_selection.py --out "$OUT/second" > "$OUT/selection2.log" 2>&1
echo "selection (second) rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|NOT met|model accuracy|first result .* ms: the miss" "$OUT/selection2.log" | grep -E "learned-shipped|steady/oracle over|accuracy|NOT met" | cut -c1-260
mixed_table 150 w7
contention 110
