#!/usr/bin/env bash
# run S88: decode steps in CUDA graphs, first on the GPU: the engine's graph test (greedy
# tokens of captured and replayed steps against eager ones, tiny preset, float32; one
# step's wall eager against replayed, printed), then the 2:4 headline with adaptive's
# decode steps captured (--adaptive-graphs: one step per rows and cache length in the
# warm-up; S85: adaptive's steps 10.7 ms at 8 rows for ~3.3 ms of device time, SM activity
# 0.514x and 0.219x torch-nocudnn's)
source "$(dirname "$0")/setup.sh"
nvrtc_check 60
t0=$SECONDS
timeout 110 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_engine_graphs_cuda.py > "$OUT/graphs_test.log" 2>&1
echo "graphs test rc=$? $((SECONDS-t0)) s"; grep -E "decode step|passed|failed|Error" "$OUT/graphs_test.log" | tail -6 | cut -c1-300
headline 420 2:4 torch-nocudnn,adaptive --adaptive-graphs
