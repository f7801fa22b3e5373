#!/usr/bin/env bash
# run S64 (when a session has the time): the shipped pack rebuilt with the wide preset's
# ten multi-head prefill attention cases (S47's pack measured the flash kernels on 2
# prefill inputs), then the selection benchmark on it. Bring $OUT/h200.msgpack back and
# commit it if pack.log shows every case built
source "$(dirname "$0")/setup.sh"
build_pack 340
t0=$SECONDS
timeout 110 python3 benchmarks/gpu_selection.py --out "$OUT" > "$OUT/selection.log" 2>&1
echo "selection rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|MATCHED|NOT|first result .* ms: the miss|model accuracy" "$OUT/selection.log" | cut -c1-300
