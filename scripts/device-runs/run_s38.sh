#!/usr/bin/env bash
# run S38 (next session, first): after 4ec4769 (steady samples never start a refit; a
# class whose calls bring new keys charges each candidate its preparation per call).
# gpu_hostpath with F.linear (TN) against torch.mm(W, xT) (NN) at the server's decode
# shapes (S33's NN-served decode stepped in 9.8 ms, S35's F.linear in 18.7), then
# generate() with every candidate and the batch-1 ablation (S34: 0.885 / 0.897)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 120 python3 benchmarks/gpu_hostpath.py --out "$OUT" > "$OUT/hostpath.log" 2>&1
echo "hostpath rc=$? $((SECONDS-t0)) s"; cut -c1-200 "$OUT/hostpath.log"
t0=$SECONDS
timeout 330 python3 benchmarks/gpu_generate.py --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json "$OUT/" 2>/dev/null
grep -E "warm-up|tokens/s|p50 / p99|greedy|committed choices|ratio|ablation [a-z]" "$OUT/generate.log" | cut -c1-260
