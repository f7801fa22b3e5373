#!/usr/bin/env bash
# run S104 (at most about 330 s, a fresh machine): issue 13's 2:4 dispatcher bar and issue
# 14's streams after the "measured" issuing charge (a host-bound class's exploring samples
# timed ungated on the idle stream: the host's latency to the launch plus the device time,
# charged at least the issuing; S101's "sum" committed our kernels over dense cuBLAS at
# 0.42-0.86x and flash2_mma over SDPA at 0.80x) and spmm's dense baseline through
# torch.matmul for tensor callers (S101: through CuPy, its samples read 0.12-0.19 ms for
# 0.010-0.036 ms kernels), on the rebuilt pack (S103). The tensor test of the dense
# baseline first; gpu_sparse24 now also prints the eager loop's wall per call; then
# selection once and the main job's mixed table (S102: attention 1.453 vs 1.056)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_spmm_24_cuda.py -k "torch_tensors" > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/tests.log" | cut -c1-300
sparse24_bar 230 190
selection 100
mixed_table 100
