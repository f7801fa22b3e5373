#!/usr/bin/env bash
# run S74: the contention run with each disputed choice's issuing measured in-process, the
# library variants' issuing windows, and a caller-time table beside the oracle (S72's
# probe: cuBLAS held from CuPy issues in 17-19 us in a fresh process, where the contention
# run charged it 42.7-76 us and committed tc_wide at 2.2-4.0x cuBLAS), then generate()
# with library kernels only, given the time its profile needs (S70: cut at 300 s after the
# ratios: batch 1 0.985, batch 16 0.902 in rounds)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 80 python3 benchmarks/gpu_contention.py --out "$OUT/contention" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"; tail -10 "$OUT/contention.log"
grep -E "issuing of a pinned launch|issuing charged so far|issuings of" "$OUT/contention.log" | head -14 | cut -c1-330
grep -h "geomean caller" "$OUT/contention.log"
t0=$SECONDS
timeout 420 python3 benchmarks/gpu_generate.py --library-only --rounds 1 --lockstep-rounds 2 --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json /tmp/gen/generate_profile_*.txt "$OUT/" 2>/dev/null
grep -E "ratio|ablation \(lockstep\)|profile batch|^    .* host +[+-][0-9.]+ ms \(calls" "$OUT/generate.log" | grep -v UserWarning | cut -c1-220
