#!/usr/bin/env bash
# run S178 (about 480 s on an H200, 210 s on an H100; the forty-first session's third
# call). On an H200: S177 there (the selection on the H200 pack as it is, the pack extended
# with the 16 long prefills, the selection twice on it; commit $OUT/merged.msgpack as
# adaptive/packs/h200.msgpack). On an H100 (whose pack S177 extended, committed): the
# selection a third time on it and the mixed table.
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
card_header
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*)
    selection_as base 125
    nvrtc_variants 60 attention/flash_mma,attention/flash2_mma,attention/flash2_pair_mma,attention/flash2_ksplit_mma,attention/flash_wgmma
    extend_pack scripts/device-runs/long_prefills.json long_prefills 100
    selection_as extended 125
    selection_as extended2 110 ;;
  *)
    selection_as third 125
    mixed_table 80 s178 ;;
esac
