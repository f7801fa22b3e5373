#!/usr/bin/env bash
# run S33 (next session, first): the server on the same requests in both modes after the
# warm-up turn and the least issuing (abdcf1b); its profiled prefill now lists every SDPA
# call with the fused backends that take it (S26: adaptive's in-server prefill ran SDPA's
# math path in all 16 layers, 3.3x torch's prefill at 8 rows; in isolation cuDNN, 1.01x)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 400 python3 benchmarks/gpu_server.py --out /tmp/srv --modes torch,adaptive > "$OUT/server.log" 2>&1
echo "server rc=$? $((SECONDS-t0)) s"
cp /tmp/srv/*.json "$OUT/" 2>/dev/null
grep -E "serving after|engine:|policy:|misses:|adaptive / torch at" "$OUT/server.log" | cut -c1-240
grep -E "batch [0-9]+:" "$OUT/server.log" | cut -c1-120
grep -E "prefill profile" "$OUT/server.log" | cut -c1-420
