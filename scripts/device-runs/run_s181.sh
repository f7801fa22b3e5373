#!/usr/bin/env bash
# run S181 (the forty-second session; about 250 s on an H200, 200 s on an H100). On an
# H200: S179 (the selection on the H200 pack as it is, the pack extended with the 16 long
# prefills, the selection twice on it; commit $OUT/merged.msgpack as
# adaptive/packs/h200.msgpack), S179c to follow on the same machine. On an H100: the tree
# with `Learned.far_refine` (97a54fe) on its first GPU, the selection twice and the
# contention on the extended H100 pack
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
    selection_as farrefine 110
    selection_as farrefine2 110
    contention 110
    contention_lines ;;
esac
