#!/usr/bin/env bash
# run S157 (about 300 s plus the start): S153's GPU test failures mended (a test's first
# launch of a new class now waits for its decide off the calling thread, as a server's
# warm-up does; the softmax stand-in test holds the decide to see the stand-in serve), the
# mixed table whose input's first call waits for its decide (S154: gemm and spmm streams
# over before their decides, every input priced at its stand-in), and selection on the
# shipped pack with flash_wgmma's rows (S156's, now loading), twice; before it, flash_wgmma
# measured on the pack's 8 grouped-query causal prefills (only SDPA's rows there: the
# example server's Llama prefills are grouped-query), merged into the pack (commit $OUT's)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
gpu_tests 130 tests/gpu/test_policy_cuda.py tests/gpu/test_counterlog_cuda.py
grep -E "^(FAILED|ERROR)|^E  .*(Assertion|still exploring)" "$OUT/tests.log" | head -12 | cut -c1-300
mixed_table 120 w11
extend_pack scripts/device-runs/gqa_prefills.json gqa 60 flash_wgmma
rm -f "$OUT/gqa.msgpack" "$OUT/merge.log"
selection 150
selection_second 150
