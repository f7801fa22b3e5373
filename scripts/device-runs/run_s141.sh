#!/usr/bin/env bash
# run S141 (at most about 380 s plus the start, a fresh machine): the baseline left behind
# on two samples over 1.5 race bars (BASELINE_RACE_FACTOR, was 2): selection (long-burst's
# tuning runs read 9.8-10.2% in S137-S140), then the GPU tests of the dispatcher, the new
# user's path and the integrations on the session's last tree (the suite's conftest now
# sets OPENBLAS_THREAD_TIMEOUT)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
selection 170
gpu_tests 190 tests/gpu/test_cuda_backend.py tests/gpu/test_new_user_cuda.py tests/gpu/test_integration_fast_paths_cuda.py tests/gpu/test_transformers_cuda.py
