#!/usr/bin/env bash
# run S165 (about 400 s, one call, an H100 only: require_gpu H100; after S164): the GPU
# policy tests again (S164 failed one: a drift re-explored its committed decode key at the
# end; the test now asks for the commit, and a drift after it), the contention with the
# H100's pack set aside (cold keys: the thirty-seventh session's cold contention on an
# H100 missed all five conditions at 1.23-1.27, a decode committed at 2.76x on samples
# read 2-5x their device times; exploring samples read past their expired gate are now
# dropped and timed again), then the 45 cases of the wide preset S163 left unmeasured
# (h100_wide_rest.json) measured into the H100's pack (commit $OUT/merged.msgpack as
# adaptive/packs/h100-80gb-hbm3.msgpack)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
require_gpu H100
gpu_tests 90 tests/gpu/test_policy_cuda.py
grep -E "^(FAILED|ERROR)|^E  .*(Assertion|still exploring)" "$OUT/tests.log" | head -8 | cut -c1-300
contention_cold 150
nvrtc_check 80
extend_pack scripts/device-runs/h100_wide_rest.json h100_wide_rest 110
echo "merged sha256 $(sha256sum /tmp/merged.msgpack | cut -c1-16)"
rm -f "$OUT/h100_wide_rest.msgpack"
