#!/usr/bin/env bash
# run S183 (the forty-fourth session; about 520 s on an H200, 400 s on an H100): S179 and
# S179c in one call, for a session with under 1000 s of device time. On an H200: the pack
# extended with the 16 long prefills (commit $OUT/merged.msgpack as
# adaptive/packs/h200.msgpack), the selection, the mixed table and the contention on it
# (S179's selection on the pack as it was, and its second selection, left out). On an
# H100: the contention under issue_floor "window" (the default) and then "seeded"
# (contention2.log), the selection under "seeded" and then "window", then the mixed table on
# the extended H100 pack (spmm's refinement before every commit, 9b814b0, on its first mixed
# table)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
card_header
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) ;;
  *) contention 100
     contention_lines
     export ADAPTIVE_ISSUE_FLOOR=seeded
     contention_again 100
     grep -E "over the bar; its key's history|policy:" "$OUT/contention2.log" | cut -c1-1500
     selection_as seeded 100
     unset ADAPTIVE_ISSUE_FLOOR
     selection_as window 100
     mixed_table 80 s183
     exit ;;
esac
nvrtc_variants 60 attention/flash_mma,attention/flash2_mma,attention/flash2_pair_mma,attention/flash2_ksplit_mma,attention/flash_wgmma
extend_pack scripts/device-runs/long_prefills.json long_prefills 100
use_card_pack
selection_as extended 110
mixed_table 80 s183
contention 110
