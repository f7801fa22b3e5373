#!/usr/bin/env bash
# run S179b (about 300 s, an H200 only; stops at once on another card): S179 cut to what
# the session's device time left allows: the H200 pack extended with the 16 long prefills
# (commit $OUT/merged.msgpack as adaptive/packs/h200.msgpack) and the selection on it
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
require_h200
card_header
nvrtc_variants 60 attention/flash_mma,attention/flash2_mma,attention/flash2_pair_mma,attention/flash2_ksplit_mma,attention/flash_wgmma
extend_pack scripts/device-runs/long_prefills.json long_prefills 100
selection_as extended 125
