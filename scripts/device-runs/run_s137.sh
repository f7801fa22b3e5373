#!/usr/bin/env bash
# run S137 (at most about 300 s plus the start, a fresh machine): the tree with torch's
# contexts skipped where torch is already on CuPy's device and stream (4693842): the GPU
# tests of SDPA from CuPy (both paths), the SDPA probe again, then every GPU bar of issue
# 14 on one tree: selection, the mixed table, contention
source "$(dirname "$0")/setup.sh"
gpu_tests 120 tests/gpu/test_spmm_attention_cuda.py -k "sdpa or torch_library"
probe 90 sdpa_issue 60 benchmarks/probe_sdpa_issue.py
selection 170
mixed_table 150 w5
contention 110
