#!/usr/bin/env bash
# run S146 (about 330 s plus the start, a fresh machine): Plan.holdable (the integrations
# hold no plan made before the shipped pack's fit; S145's warm-up ended at its limit with
# 46 keys pending): the GPU tests of the policy and the integrations' fast paths, then the
# example server in both modes
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
gpu_tests 100 tests/gpu/test_policy_cuda.py tests/gpu/test_integration_fast_paths_cuda.py
serve_both 290
