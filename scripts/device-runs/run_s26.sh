#!/usr/bin/env bash
# run S26 (next session, first): the server with the warm-up one decode further (S25 still
# met the 305-key class under load), each load's policy activity (refits, drifts: S25's
# adaptive decode steps were 22-25 ms against torch's 11-12 on five of eight batches) and
# one prefill profiled in each mode (adaptive's time to first tokens 1.7x torch's in the
# server, 1.05x in isolation); then selection with min_explore (S24: cuBLAS committed
# unseen at 1.7x on gemm 4x1024x1024)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 380 python3 benchmarks/gpu_server.py --out /tmp/srv --modes torch,adaptive > "$OUT/server.log" 2>&1
echo "server rc=$? $((SECONDS-t0)) s"
cp /tmp/srv/*.json "$OUT/" 2>/dev/null
grep -E "serving after|engine:|policy:|misses:|adaptive / torch at" "$OUT/server.log" | cut -c1-240
grep -E "batch [0-9]+:" "$OUT/server.log" | grep -v " 0 slow" | cut -c1-200
grep -E "prefill profile" "$OUT/server.log" | cut -c1-200
t0=$SECONDS
timeout 130 python3 benchmarks/gpu_selection.py --out "$OUT" > "$OUT/selection.log" 2>&1
echo "selection rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|MATCHED|NOT|learned-shipped .*issuing charged" "$OUT/selection.log" | cut -c1-300
python3 - "$OUT/gpu_selection.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for s in d["streams"]:
    rows = []
    for inp, v in s["per_input"].items():
        ch = v["choices"]; o = ch["oracle/replayed"]; me = ch.get("learned-shipped/live", ch["learned-pack/live"])
        rows.append(((me[1] - o[1]) * v["calls"], inp, me, o, v.get("why", {}).get("learned-shipped/live", "")))
    for ex, inp, me, o, why in sorted(rows, reverse=True)[:2]:
        print(f"{s['stream']}: excess {ex:.3f} ms {inp} chose {me[0]} {me[1]:.4f} vs oracle {o[0]} {o[1]:.4f}\n   {why[-600:]}")
PY
