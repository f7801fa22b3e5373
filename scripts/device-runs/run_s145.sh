#!/usr/bin/env bash
# run S145 (about 330 s plus the start, a fresh machine): a decision made before the
# shipped pack's fit held until the model is there (e5a6cfc): the GPU tests of the policy,
# the engine's graphs and the integrations, then the example server in both modes (its
# warm-up now waits for such keys to be decided again: no exploring call while serving)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
gpu_tests 150 tests/gpu/test_policy_cuda.py tests/gpu/test_engine_graphs_cuda.py tests/gpu/test_transformers_cuda.py tests/gpu/test_integration_fast_paths_cuda.py
serve_both 230
grep -E "warm-up|decided before|pending" "$OUT/server.log" | head -12 | cut -c1-240
