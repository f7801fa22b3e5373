#!/usr/bin/env bash
# run S86: the 2:4 headline after cuSPARSELt's transposed-operand route was dropped (S85:
# one such call a prefill took 0.26-7.0 s of host time; adaptive 1.296x and 0.941x
# torch-nocudnn's tokens/s, p99 0.621x and 0.673x), with the fast-path GPU tests first
# (cuSPARSELt handed row-major operands only, at 3x37, 8x512 and 16x512 tokens)
source "$(dirname "$0")/setup.sh"
nvrtc_check 60
t0=$SECONDS
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_integration_fast_paths_cuda.py > "$OUT/fastpath_tests.log" 2>&1
echo "fast-path GPU tests rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/fastpath_tests.log"
headline 440 2:4 torch-nocudnn,adaptive
