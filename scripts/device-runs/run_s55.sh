#!/usr/bin/env bash
# run S55 (after S47): generate() with torch's calls only, an attention class held on SDPA
# now served by transformers' own SDPA function (S50's ablation: our function around the
# same call cost 1.4% of batch 1; lockstep batch 1 0.946 against the 0.98 bar), the
# batch-1 ablation in lockstep; then gemm from CuPy arrays, each way's issuing alone (the
# quantity a host-bound class is charged), and the contention run on S47's pack
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 300 python3 benchmarks/gpu_generate.py --library-only --rounds 1 --lockstep-rounds 2 --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json "$OUT/" 2>/dev/null
grep -E "warm-up [0-9]|threads while|rounds batch|ablation \(lockstep\)|ratio|committed" "$OUT/generate.log" | grep -v "^  lockstep request\|^  b1 ablation" | cut -c1-220
t0=$SECONDS
timeout 60 python3 benchmarks/gpu_hostpath.py --cases cupy-gemm,cupy-attention --out "$OUT" > "$OUT/hostpath.log" 2>&1
echo "hostpath rc=$? $((SECONDS-t0)) s"; cut -c1-200 "$OUT/hostpath.log"
t0=$SECONDS
timeout 100 python3 benchmarks/gpu_contention.py --out "$OUT" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"
tail -9 "$OUT/contention.log"
