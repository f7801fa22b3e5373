#!/usr/bin/env bash
# run S164 (about 540 s, one call; after S163 built a pack for a card other than the
# H200, committed as adaptive/packs/<card>.msgpack): on that card, with its pack, the GPU
# tests that need a pack for the card (two skipped in S160) and the stream gate's expiry,
# the contention (an exploring sample read past its expired gate is now dropped and timed
# again: thirty-eighth session;
# a row over the bar prints its key's history), the selection (learned-shipped on the
# card's pack) and the main job's mixed table. On an H200, the same on the H200's pack.
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
for p in adaptive/packs/*.msgpack; do echo "pack $p sha256 $(sha256sum "$p" | cut -c1-16)"; done
gpu_tests 120 tests/gpu/test_policy_cuda.py tests/gpu/test_timing_cuda.py
grep -E "^(FAILED|ERROR)|^E  .*(Assertion|still exploring)|SKIPPED" "$OUT/tests.log" | head -8 | cut -c1-300
contention 140
grep -E "over the bar; its key's history|issuing charged so far|past its gate|past_gate" "$OUT/contention.log" | cut -c1-1500
rm -f "$OUT/contention.json"
selection 150
mixed_table 120 s164
