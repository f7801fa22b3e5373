#!/usr/bin/env bash
# run S112 (at most about 200 s, after S111 on its machine): the wide preset's new float32
# spmm inputs (scripts/device-runs/spmm_fp32.json; the pack held 6 float32 spmm inputs and
# the mixed table's float32 spmm stream committed cuSPARSE at 3.6x csr_rowsplit, runs
# S104-S108) measured and merged into the shipped pack (commit it from $OUT), then the
# mixed table, then selection: the first run with the ranking charged the host's issuing
# where the device waits (Context.charge; S109 read 1.004 / 1.057 / 1.013 without it)
source "$(dirname "$0")/setup.sh"
extend_pack scripts/device-runs/spmm_fp32.json spmm32 90
t0=$SECONDS
timeout 60 python3 -m adaptive.cli bench mixed --backend cuda > "$OUT/bench_mixed.log" 2>&1
echo "bench mixed rc=$? $((SECONDS-t0)) s"
grep -E "^all ops|BEAT|MATCHED|NOT|largest excess" "$OUT/bench_mixed.log" | cut -c1-300
selection 110
