#!/usr/bin/env bash
# run S153 (about 350 s plus the start, a fresh machine): a new input class decided off the
# calling thread (the library's candidate serving its first calls) and race_ratio 1.3 the
# default. The GPU tests of the dispatcher's users (the first-fit wait both ways, softmax's
# stand-in, the integrations, the counter log, the server block, transformers); selection
# twice, the default policy and explore_fraction 0.3 with explore_share 0.1 (the CPU
# replay: explore_fraction 0.3 moves attention alone, prefill's tuning share 11.1 -> 10.3%
# and within 5% 85.7 -> 88.4% with noisy samples over three dealings, the corpus unchanged;
# explore_share 0.1 moves spmm and softmax alone, within 5% 82 -> 84% and 84 -> 86% at
# +0.5-0.7 points of their tuning share; long-burst read 9.9% in S152, bar 10%), both
# reading the first result; contention
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
gpu_tests 120 tests/gpu/test_policy_cuda.py tests/gpu/test_integration_fast_paths_cuda.py tests/gpu/test_counterlog_cuda.py tests/gpu/test_server_block_cuda.py tests/gpu/test_transformers_cuda.py
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -10 | cut -c1-240
selection_second 150
selection 150 --learned explore_fraction=0.3 --learned explore_share=0.1
contention 110
rm -f "$OUT/contention.json"
