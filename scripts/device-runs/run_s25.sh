#!/usr/bin/env bash
# run S25: the prefill side by side and profiled (S24: adaptive's time to first tokens
# 77.8 ms against torch's 45.9 at 8 clients, growing with the batch's tokens), then the
# server again with the warm-up reaching every decode class of 64 new tokens (S24: a class
# met under load at 305 keys, 15 slow steps and one of 808 ms)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 200 python3 benchmarks/gpu_prefill.py --out "$OUT" > "$OUT/prefill.log" 2>&1
echo "prefill rc=$? $((SECONDS-t0)) s"
grep -vE "^USDT|^\s+gemm \{|^\s+attention \{" "$OUT/prefill.log" | cut -c1-200 | tail -40
grep -E "^\s+(gemm|attention) \{" "$OUT/prefill.log" | cut -c1-330 | head -24
t0=$SECONDS
timeout 330 python3 benchmarks/gpu_server.py --out /tmp/srv --modes torch,adaptive > "$OUT/server.log" 2>&1
echo "server rc=$? $((SECONDS-t0)) s"
cp /tmp/srv/*.json "$OUT/" 2>/dev/null
grep -E "serving after|engine:|misses:|adaptive / torch at" "$OUT/server.log" | cut -c1-240
grep -E "batch [0-9]+:" "$OUT/server.log" | grep -v " 0 slow" | cut -c1-200
