#!/usr/bin/env bash
# run S24: the server with each load serving the same first requests in every mode (S22's
# windows served different batches: p99 1.094x/1.120x compared different prompts), each
# batch's slow steps printed; then selection with each learned choice's account (S22:
# uniform-mix learned-shipped 1.083, excess on spmm 4096x256x4096 and gemm 1024x2048x2048)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 300 python3 benchmarks/gpu_server.py --out /tmp/srv --modes torch,adaptive > "$OUT/server.log" 2>&1
echo "server rc=$? $((SECONDS-t0)) s"
cp /tmp/srv/*.json "$OUT/" 2>/dev/null
grep -E "engine:|batch [0-9]+:|adaptive / torch at" "$OUT/server.log" | cut -c1-240
t0=$SECONDS
timeout 130 python3 benchmarks/gpu_selection.py --out "$OUT" > "$OUT/selection.log" 2>&1
echo "selection rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|MATCHED|NOT" "$OUT/selection.log" | cut -c1-200
python3 - "$OUT/gpu_selection.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for s in d["streams"]:
    rows = []
    for inp, v in s["per_input"].items():
        ch = v["choices"]; o = ch["oracle/replayed"][1]; me = ch.get("learned-shipped/live", ch["learned-pack/live"])
        rows.append(((me[1] - o) * v["calls"], inp, me, o, v.get("why", {}).get("learned-shipped/live", v.get("why", {}).get("learned-pack/live", ""))))
    for ex, inp, me, o, why in sorted(rows, reverse=True)[:2]:
        print(f"{s['stream']}: excess {ex:.3f} ms {inp} chose {me[0]} {me[1]:.4f} vs oracle {o:.4f}\n   {why[-700:]}")
PY
