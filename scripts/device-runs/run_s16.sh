#!/usr/bin/env bash
# run S16: the shipped pack rebuilt with gated timing (a run's device time, not the host's
# issuing of it: run S14's pack charged SDPA 0.1-0.4 ms at decode), the kernel cache warmed
# first by the NVRTC check; then decode attention on it (issue 13)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 70 python3 -m adaptive.cli nvrtc-check --workers 15 --quiet > "$OUT/nvrtc.log" 2>&1
echo "nvrtc rc=$? $((SECONDS-t0)) s"; tail -1 "$OUT/nvrtc.log"
t0=$SECONDS
timeout 225 python3 benchmarks/gpu_pack.py --deadline-s 190 --out /tmp/packout > "$OUT/pack.log" 2>&1
echo "pack rc=$? $((SECONDS-t0)) s"
tail -2 "$OUT/pack.log" | cut -c1-300
cp /tmp/packout/h200.msgpack /tmp/packout/gpu_pack.json "$OUT/" && cp /tmp/packout/h200.msgpack adaptive/packs/h200.msgpack
python3 - <<'PY' 2>&1 | tail -12
from adaptive.packs import format as p
from collections import defaultdict
by = defaultdict(dict)
for r in p.read_pack("adaptive/packs/h200.msgpack").rows:
    if r.op == "attention" and r.dims.get("Lq", 0) <= 16:
        by[tuple(sorted(r.dims.items()))][r.variant] = min(r.time_ms, by[tuple(sorted(r.dims.items()))].get(r.variant, 9))
for k, v in list(by.items())[:10]:
    print(dict(k), {n: round(t * 1e3, 1) for n, t in sorted(v.items(), key=lambda kv: kv[1])[:3]}, "sdpa", round(v.get("sdpa_torch", 0) * 1e3, 1))
PY
t0=$SECONDS
timeout 95 python3 benchmarks/gpu_decode_attention.py --out "$OUT" > "$OUT/decode.log" 2>&1
echo "decode rc=$? $((SECONDS-t0)) s"
grep -E "MET|NOT" "$OUT/decode.log" | cut -c1-200
