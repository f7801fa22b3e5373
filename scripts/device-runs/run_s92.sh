#!/usr/bin/env bash
# run S92 (a fresh machine, at most about 575 s): the two GPU tests fixed after S86 and
# S88 (a race verdict held per token class; the graph test's timing under inference mode,
# and now its captured decode run one step ahead: StaticDecode.run), then the dense
# headline with every mode's decode steps in CUDA graphs (S90 against eager torch-nocudnn:
# 8.54x and 7.66x tokens/s; S91, 2:4, against torch-nocudnn+graphs: 2.389x and 4.338x)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 120 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_integration_fast_paths_cuda.py tests/gpu/test_engine_graphs_cuda.py > "$OUT/gpu_tests.log" 2>&1
echo "GPU tests rc=$? $((SECONDS-t0)) s"; grep -E "decode step|passed|failed|Error" "$OUT/gpu_tests.log" | tail -6 | cut -c1-300
headline 430 dense torch+graphs,torch-nocudnn+graphs,adaptive+graphs
