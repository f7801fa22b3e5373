#!/usr/bin/env bash
# run S29 (next session, after S28): the dense headline serving the same requests in both
# modes (S23's 16 s windows held one or two batches of different requests: not a
# measurement), each load's policy activity and one prefill profiled per mode
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 480 python3 benchmarks/gpu_headline.py --case dense --out "$OUT" > "$OUT/headline_dense.log" 2>&1
echo "headline dense rc=$? $((SECONDS-t0)) s"
grep -E "serving after|engine:|policy:|prefill profile: batch" "$OUT/headline_dense.log" | cut -c1-240
tail -6 "$OUT/headline_dense.log" | cut -c1-300
