#!/usr/bin/env bash
# run S112 (at most about 200 s, after S111 on its machine): the wide preset's new float32
# spmm inputs (scripts/device-runs/spmm_fp32.json; the pack held 6 float32 spmm inputs and
# the mixed table's float32 spmm stream committed cuSPARSE at 3.6x csr_rowsplit, runs
# S104-S108) measured and merged into the shipped pack (commit it from $OUT), then the
# mixed table
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 120 python3 -m adaptive.cli pack build --shapes scripts/device-runs/spmm_fp32.json --backend cuda --warmup 2 --repeats 7 --seed 0 --cubins --deadline-s 90 --no-progress -o /tmp/spmm32.msgpack > "$OUT/spmm32.log" 2>&1
echo "spmm fp32 build rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/spmm32.log" | cut -c1-200
python3 -m adaptive.cli pack merge -o /tmp/merged.msgpack adaptive/packs/h200.msgpack /tmp/spmm32.msgpack > "$OUT/merge.log" 2>&1
echo "merge rc=$?"; tail -2 "$OUT/merge.log" | cut -c1-200
cp /tmp/merged.msgpack adaptive/packs/h200.msgpack && cp /tmp/merged.msgpack "$OUT/"
t0=$SECONDS
timeout 60 python3 -m adaptive.cli bench mixed --backend cuda > "$OUT/bench_mixed.log" 2>&1
echo "bench mixed rc=$? $((SECONDS-t0)) s"
grep -E "^all ops|BEAT|MATCHED|NOT|largest excess" "$OUT/bench_mixed.log" | cut -c1-300
