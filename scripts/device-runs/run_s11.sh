#!/usr/bin/env bash
# run S11 (next session, after S10 and the rebuilt pack copied to adaptive/packs/): issue 12
# on the rebuilt pack, the baseline margin and the stream gate: generate() and the server,
# torch against adaptive side by side
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 250 python3 benchmarks/gpu_generate.py --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/*.json "$OUT/" 2>/dev/null
tail -40 "$OUT/generate.log" | cut -c1-300
t0=$SECONDS
timeout 240 python3 benchmarks/gpu_server.py --out /tmp/srv --modes torch,adaptive > "$OUT/server.log" 2>&1
echo "server rc=$? $((SECONDS-t0)) s"
cp /tmp/srv/*.json "$OUT/" 2>/dev/null
tail -22 "$OUT/server.log" | cut -c1-400
