#!/usr/bin/env bash
# run S167 (about 120 s, an H100 only: require_gpu H100): S159a's vocabulary softmax
# (softmax_vocab.json: 22 inputs at C=32000-32768, R=4-384) measured into the H100's pack.
# Run S166's uniform-mix committed block_row at 1.21x reg_row_cs on softmax R=64 C=32000:
# the H100 pack's vocabulary rows are all at C >= 48k or C <= 24k, where block_row wins.
# Commit $OUT/merged.msgpack as adaptive/packs/h100-80gb-hbm3.msgpack.
source "$(dirname "$0")/setup.sh"
require_gpu H100
extend_pack scripts/device-runs/softmax_vocab.json softmax_vocab 80
echo "merged sha256 $(sha256sum /tmp/merged.msgpack | cut -c1-16)"
rm -f "$OUT/softmax_vocab.msgpack"
