#!/usr/bin/env bash
# run S35: the server on the same requests in both modes after a weight kept as given
# serves a new shape of a committed torch-matmul class by F.linear (S33: adaptive's
# prefill made two transposing copies per linear, 21 ms of 46); the profiled prefill
# lists the way each linear went (engine.linear_spy)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 400 python3 benchmarks/gpu_server.py --out /tmp/srv --modes torch,adaptive > "$OUT/server.log" 2>&1
echo "server rc=$? $((SECONDS-t0)) s"
cp /tmp/srv/*.json "$OUT/" 2>/dev/null
grep -E "serving after|engine:|policy:|misses:|adaptive / torch at" "$OUT/server.log" | cut -c1-240
grep -E "prefill profile" "$OUT/server.log" | cut -c1-420
