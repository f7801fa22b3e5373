#!/usr/bin/env bash
# run S21 (this session, after S20): the policy charged what a call costs the caller (the
# host's issuing on top of the device time where the device waited for the host): issue
# 14's main job first (S20: learned 1.52/1.90/1.27 against best-fixed 1.05/1.06/1.15,
# measure-each as far off), then generate() at batch 1 and 16 (issue 12; S19: batch 1
# 0.949x), then the decode shapes where SDPA wins, warmed behind a spin (S18's 1000 us row)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 130 python3 benchmarks/gpu_selection.py --out "$OUT" > "$OUT/selection.log" 2>&1
echo "selection rc=$? $((SECONDS-t0)) s"
grep -E "^(decode-heavy|long-burst|uniform-mix|steady/oracle over)" "$OUT/selection.log" | cut -c1-260
t0=$SECONDS
timeout 190 python3 benchmarks/gpu_generate.py --no-ablation --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/*.json "$OUT/" 2>/dev/null
grep -E "ratio|committed choices" "$OUT/generate.log" | cut -c1-200
t0=$SECONDS
timeout 80 python3 benchmarks/gpu_decode_attention.py --shapes "gqa B=1 Lk=,gqa B=32,mha" --out /tmp/dec > "$OUT/decode.log" 2>&1
echo "decode rc=$? $((SECONDS-t0)) s"
cp /tmp/dec/decode_attention.json "$OUT/" 2>/dev/null
grep -E "NOT|MET" "$OUT/decode.log" | grep "SDPA" | cut -c1-120
