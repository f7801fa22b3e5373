#!/usr/bin/env bash
# run S155 (about 400 s plus the start, a fresh machine): flash_wgmma (attention on wgmma,
# sm_90a; experimental until this passes): its GPU tests (whether the H200 reads the
# 128-byte-swizzled tiles through the descriptors as the CPU emulation of the PTX ISA does),
# then its device time beside SDPA and the flash2 kernels on prefills, causal and full, and
# as left-padded batches (a boolean mask as transformers passes SDPA, against its MASKED
# configs) (benchmarks/probe_causal_prefill.py: a config that disagrees with SDPA is
# reported, not fatal). Each flash variant's best config against SDPA is the line per input.
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
# the probed kernels compiled first, 15 at a time (the probe compiles on its first launch of
# each, one after another: the flash2 family's 48 would take much of its limit)
nvrtc_variants 60 attention/flash2_mma,attention/flash2_pair_mma,attention/flash2_ksplit_mma,attention/flash_wgmma
gpu_tests 170 tests/gpu/test_attention_wgmma_cuda.py
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -12 | cut -c1-300
probe 100 causal 0 benchmarks/probe_causal_prefill.py --reps 9
grep -E "^B=|WRONG|configs gave wrong" "$OUT/causal.log" | cut -c1-420
probe 90 full 0 benchmarks/probe_causal_prefill.py --reps 9 --full
grep -E "^B=|WRONG|configs gave wrong" "$OUT/full.log" | cut -c1-420
probe 100 padded 0 benchmarks/probe_causal_prefill.py --reps 9 --padded
grep -E "^B=|WRONG|configs gave wrong" "$OUT/padded.log" | cut -c1-420
