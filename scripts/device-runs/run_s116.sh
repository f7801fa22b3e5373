#!/usr/bin/env bash
# run S116 (at most about 420 s, a fresh machine): the mixed table with adaptive started as
# adaptive.launch's dispatcher (the shipped pack; until S114 it ran learned cold) and a
# candidate whose samples disagree timed again (Learned.noise_ratio); the contention bar
# (S74 met it under "sum"; not run since the charged ranking and the noise rule); then,
# if time is left, selection once more with the noise rule (S114: 1.007 / 1.020 / 1.026)
source "$(dirname "$0")/setup.sh"
mixed_table 170
grep -E "adaptive's policy" "$OUT/bench_mixed.log" | head -2
t0=$SECONDS
timeout 110 python3 benchmarks/gpu_contention.py --out "$OUT" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"; tail -12 "$OUT/contention.log" | cut -c1-300
if [ "$SECONDS" -lt 250 ]; then selection 120; else echo "selection skipped at $SECONDS s"; fi
