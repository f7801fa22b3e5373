#!/usr/bin/env bash
# run S65 (first of the thirteenth session): the whole of tests/gpu/test_spmm_attention_cuda.py
# (issue 12's criterion; S60's stream test was cut at 40 s computing its float64
# references, now at sizes whose references take seconds), then the bsr10 headline with a
# sparse layer on spmm's baseline served as F.linear (S62's run, never made)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_spmm_attention_cuda.py > "$OUT/tests.log" 2>&1
echo "test_spmm_attention_cuda rc=$? $((SECONDS-t0)) s"; grep -E "passed|failed|error" "$OUT/tests.log" | tail -5 | cut -c1-300
t0=$SECONDS
timeout 330 python3 benchmarks/gpu_headline.py --case bsr10 --out "$OUT" > "$OUT/headline_bsr10.log" 2>&1
echo "headline bsr10 rc=$? $((SECONDS-t0)) s"
grep -E "serving after|pooled|engine:|prefill profile: (batch|route|.*aten::copy_)" "$OUT/headline_bsr10.log" | cut -c1-220
tail -8 "$OUT/headline_bsr10.log" | cut -c1-300
