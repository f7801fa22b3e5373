#!/usr/bin/env bash
# run S144 (about 320 s plus the start, a fresh machine): the GPU test of a request made
# before the shipped pack's fit (tests/gpu/test_policy_cuda.py) with the new user's tests,
# selection twice and contention once more on the twenty-eighth session's tree
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
gpu_tests 150 tests/gpu/test_policy_cuda.py tests/gpu/test_new_user_cuda.py
selection 170
selection_second 170
contention 110
contention_history
