#!/usr/bin/env bash
# run S161 (about 520 s, one call, an H200 only: require_h200; in place of S159a and S159b
# where only one machine start comes in a session): on the committed pack (S158a's), first
# the contention run again (its idle condition missed in S158b: softmax R=2048 C=4096 fp16
# committed warp_row at 3.11x reg_row_cs; a row over the bar now prints its key's whole
# recent history, the samples each explored candidate was charged at the commit among
# them), then S159a's vocabulary softmax measured into the pack (softmax_vocab.json: 22
# inputs, 828 rows; commit $OUT/merged.msgpack as adaptive/packs/h200.msgpack), then the
# selection and the main job's mixed table on the merged pack
# its first part is run S162 (the contention, on an H200 only)
source "$(dirname "$0")/run_s162.sh"
extend_pack scripts/device-runs/softmax_vocab.json softmax_vocab 110
echo "merged sha256 $(sha256sum /tmp/merged.msgpack | cut -c1-16)"
rm -f "$OUT/softmax_vocab.msgpack" "$OUT/merge.log"
selection 150
mixed_table 120 s161
