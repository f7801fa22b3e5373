#!/usr/bin/env bash
# run S149 (about 400 s plus the start, a fresh machine): flash2_ksplit_mma, each row block's
# keys split between two warp groups (S148: pairing row blocks does not shorten a one-wave
# grid, whose heaviest CTA reads all the keys): its GPU tests, its device time beside SDPA,
# flash2_mma and flash2_pair_mma, its rows added to the shipped pack (every multi-head input
# of the wide preset and S148's 10 causal prefills), contention and selection on the merged pack
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
gpu_tests 150 tests/gpu/test_spmm_attention_cuda.py -k flash2
probe 150 causal 90 benchmarks/probe_causal_prefill.py
extend_pack scripts/device-runs/ksplit_inputs.json ksplit 90 flash2_ksplit_mma
rm -f "$OUT/ksplit.msgpack"
contention 110
contention_history
rm -f "$OUT/contention.json"
selection 200
