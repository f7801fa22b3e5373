#!/usr/bin/env bash
# run S15: the server on run S14's pack, torch against adaptive side by side (issue 12), then
# decode attention on it (issue 13)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 240 python3 benchmarks/gpu_server.py --out /tmp/srv --modes torch,adaptive > "$OUT/server.log" 2>&1
echo "server rc=$? $((SECONDS-t0)) s"
cp /tmp/srv/*.json "$OUT/" 2>/dev/null
tail -22 "$OUT/server.log" | cut -c1-400
t0=$SECONDS
timeout 200 python3 benchmarks/gpu_decode_attention.py --out "$OUT" > "$OUT/decode.log" 2>&1
echo "decode rc=$? $((SECONDS-t0)) s"
grep -E "MET|NOT" "$OUT/decode.log" | cut -c1-200
