#!/usr/bin/env bash
# run S114 (at most about 320 s, a fresh machine): the kept-plan cuSPARSELt on the 7 float16
# 2:4 inputs S113's 60 s left unmeasured (M = 11008, 14336), merged into the shipped pack
# (commit $OUT/merged.msgpack as adaptive/packs/h200.msgpack); the mixed table with each
# op's stream after its policy's first fit of the pack (S113 streamed beside that fit:
# samples of 1-2.6 ms among 0.03-0.2 ms kernels); selection again (S113: 1.054 / 1.084 /
# 1.036, first result 4.12 / 2.61 / 4.56 ms)
source "$(dirname "$0")/setup.sh"
extend_pack scripts/device-runs/sparse24_inputs_rest.json csltrest 60 cusparselt_plan
rm -f "$OUT/csltrest.msgpack" "$OUT/merge.log"
mixed_table 150
grep -E "pack rows; waited" "$OUT/bench_mixed.log" | head -3
selection 130
