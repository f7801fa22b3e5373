#!/usr/bin/env bash
# run S148 (about 360 s plus the start, a fresh machine): flash2_pair_mma, the causal prefill
# kernel that pairs the heaviest row block with the lightest: its GPU tests, its device time
# against SDPA and flash2_mma (probe_causal_prefill.py), its rows added to the shipped pack
# (the wide preset's 7 inputs it serves, then 10 new causal MHA prefills with every variant),
# contention on the merged pack (its prefill input ran 1.6-1.7x SDPA on flash2_mma, S142-S147)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
gpu_tests 150 tests/gpu/test_spmm_attention_cuda.py -k flash2
probe 150 causal 60 benchmarks/probe_causal_prefill.py
extend_pack scripts/device-runs/causal_pair_wide.json pairwide 60 flash2_pair_mma
rm -f "$OUT/pairwide.msgpack"
extend_pack scripts/device-runs/causal_prefill_mha.json prefill 90
rm -f "$OUT/prefill.msgpack"
contention 110
contention_history
