#!/usr/bin/env bash
# run S14: the shipped pack rebuilt in the compressed pack format (schema 2; run S10's
# complete build was 23.9 MB and too large to come back), then generate() on it (issue 12)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 290 python3 benchmarks/gpu_pack.py --deadline-s 255 --out /tmp/packout > "$OUT/pack.log" 2>&1
echo "pack rc=$? $((SECONDS-t0)) s"
tail -3 "$OUT/pack.log" | cut -c1-300
cp /tmp/packout/h200.msgpack /tmp/packout/gpu_pack.json "$OUT/" && cp /tmp/packout/h200.msgpack adaptive/packs/h200.msgpack
t0=$SECONDS
timeout 270 python3 benchmarks/gpu_generate.py --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/*.json "$OUT/" 2>/dev/null
tail -40 "$OUT/generate.log" | cut -c1-300
