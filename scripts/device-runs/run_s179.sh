#!/usr/bin/env bash
# run S179 (about 480 s, an H200 only; stops at once on another card): S178's H200 branch.
# The selection on the H200 pack as it is (S176's owed question), the pack extended with the
# 16 long prefills (commit $OUT/merged.msgpack as adaptive/packs/h200.msgpack), the
# selection twice on it
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
require_h200
card_header
selection_as base 125
nvrtc_variants 60 attention/flash_mma,attention/flash2_mma,attention/flash2_pair_mma,attention/flash2_ksplit_mma,attention/flash_wgmma
extend_pack scripts/device-runs/long_prefills.json long_prefills 100
selection_as extended 125
selection_as extended2 110
