#!/usr/bin/env bash
# run S147 (not run yet; about 420 s plus the start, a fresh machine): a miss before the
# start-up pack's first fit waits for it (e7cb4bc), on the GPU: its test, the example server
# in both modes (S145 and S146, with the replaced mechanism, ended their warm-ups at the
# limit with 37-46 keys still being decided; S122 served both modes in 172 s), contention
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
gpu_tests 100 tests/gpu/test_policy_cuda.py tests/gpu/test_integration_fast_paths_cuda.py
serve_both 290
contention 110
contention_history
