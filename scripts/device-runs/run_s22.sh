#!/usr/bin/env bash
# run S22 (next session, first): issue 14's main job again, now printing each learned
# policy's deferred/reopened classes (S21's uniform-mix excess: SDPA committed at 3.1x on
# attention B=4 Lq=1 Lk=2048, a deferral to the library suspected), then the server with
# Nagle off and the caller-cost charge (S18, before both: 0.58x at 8 clients, 1.58x at 32)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 130 python3 benchmarks/gpu_selection.py --out "$OUT" > "$OUT/selection.log" 2>&1
echo "selection rc=$? $((SECONDS-t0)) s"
grep -E "^(decode-heavy|long-burst|uniform-mix|steady/oracle over)|^  learned-.*: commits" "$OUT/selection.log" | cut -c1-260
t0=$SECONDS
timeout 240 python3 benchmarks/gpu_server.py --out /tmp/srv --modes torch,adaptive > "$OUT/server.log" 2>&1
echo "server rc=$? $((SECONDS-t0)) s"
cp /tmp/srv/*.json "$OUT/" 2>/dev/null
grep -E "engine:|adaptive / torch" "$OUT/server.log" | cut -c1-300
