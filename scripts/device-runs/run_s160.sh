#!/usr/bin/env bash
# run S160 (about 200 s plus the start; any Hopper card, an H100 too): the GPU tests of
# the policy, the counter log, the integrations' fast paths and a new user's first run,
# on the tree that settles a commit within 2%, spreads an extrapolating miss over
# variants, and reads each candidate's flops per CTA and per thread (thirty-fourth and
# thirty-fifth sessions; first run on an H100 in the thirty-seventh: 86 passed,
# 3 skipped). The pack-dependent runs (S158, S159)
# want the H200 the shipped pack was measured on; these tests do not.
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
gpu_tests 200 tests/gpu/test_policy_cuda.py tests/gpu/test_counterlog_cuda.py \
  tests/gpu/test_integration_fast_paths_cuda.py tests/gpu/test_new_user_cuda.py \
  tests/gpu/test_attention_wgmma_cuda.py
grep -E "^(FAILED|ERROR)|^E  .*(Assertion|still exploring)" "$OUT/tests.log" | head -12 | cut -c1-300
