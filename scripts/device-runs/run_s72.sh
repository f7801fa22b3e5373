#!/usr/bin/env bash
# run S72 (fourteenth session): the shipped pack rebuilt with the wide preset's multi-head
# prefill attention cases and every current variant (S47's pack: 38 variants, 168 cases;
# S70's long-burst lost on attention B=1 H=8 L=2048 D=64, where the shipped model put
# only sdpa_torch and three_pass within 20% of its best), the selection on it, cuBLAS's
# issuing from CuPy on the contention inputs (S70: charged 76 then 51 us against S55's
# 21.5 held; contention 1.74 idle), then the contention run on the new pack.
# Bring $OUT/h200.msgpack back and commit it if pack.log shows every case built
source "$(dirname "$0")/setup.sh"
build_pack 300
t0=$SECONDS
timeout 105 python3 benchmarks/gpu_selection.py --out "$OUT" > "$OUT/selection.log" 2>&1
echo "selection rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|MATCHED|NOT|first result .* ms: the miss|model accuracy|largest excess" "$OUT/selection.log" | cut -c1-260
t0=$SECONDS
timeout 40 python3 benchmarks/probe_gated_issue.py --contention-shapes > "$OUT/probe.log" 2>&1
echo "probe rc=$? $((SECONDS-t0)) s"; grep -E "^issuing|Error" "$OUT/probe.log" | cut -c1-260
t0=$SECONDS
timeout 70 python3 benchmarks/gpu_contention.py --out "$OUT/contention" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"; tail -8 "$OUT/contention.log"
grep -E "issuing charged so far" "$OUT/contention.log" | head -1 | cut -c1-400
