#!/usr/bin/env bash
# run S74: the contention run with each disputed choice's issuing measured in-process, the
# library variants' issuing windows, and a caller-time table beside the oracle (S72's
# probe: cuBLAS held from CuPy issues in 17-19 us in a fresh process, where the contention
# run charged it 42.7-76 us and committed tc_wide at 2.2-4.0x cuBLAS), then generate()
# with library kernels only, given the time its profile needs (S70: cut at 300 s after the
# ratios: batch 1 0.985, batch 16 0.902 in rounds); contention again with issue_charge max
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 80 python3 benchmarks/gpu_contention.py --out "$OUT/contention" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"; tail -10 "$OUT/contention.log"
grep -E "issuing of a pinned launch|issuing charged so far|issuings of" "$OUT/contention.log" | head -14 | cut -c1-330
# the same with a host-bound class charged the larger of device time and issuing: the
# contention loop issues a round's 7 calls back to back, one synchronise a round, where
# one call's issuing overlaps the device's run of the one before
t0=$SECONDS
timeout 80 python3 benchmarks/gpu_contention.py --issue-charge max --out "$OUT/contention_max" > "$OUT/contention_max.log" 2>&1
echo "contention (max) rc=$? $((SECONDS-t0)) s"; tail -10 "$OUT/contention_max.log"
grep -h "geomean caller" "$OUT/contention.log" "$OUT/contention_max.log"
t0=$SECONDS
timeout 420 python3 benchmarks/gpu_generate.py --library-only --rounds 1 --lockstep-rounds 2 --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json /tmp/gen/generate_profile_*.txt "$OUT/" 2>/dev/null
grep -E "ratio|ablation \(lockstep\)|profile batch|^    .* host +[+-][0-9.]+ ms \(calls" "$OUT/generate.log" | grep -v UserWarning | cut -c1-220
