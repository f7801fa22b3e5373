#!/usr/bin/env bash
# run S171 (about 350 s, any Hopper card; the thirty-ninth session's second call): the
# commit's history now names what a host-bound exploration charged each candidate (device
# time, issuing, new keys' preparation; S168's uniform-mix read all four softmax R=64
# C=32000 candidates at 2.5-5x their pack times and committed block_row at 1.21x reg_row).
# On an H200 (the pack with S168's vocabulary rows, committed): the selection twice and the
# main job's mixed table. On an H100: S169 (h100_extensions.json into the H100's pack;
# commit $OUT/merged.msgpack as adaptive/packs/h100-80gb-hbm3.msgpack), then the selection
# on it.
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $name"
case "$name" in
  *H200*)
    echo "pack sha256 $(sha256sum adaptive/packs/h200.msgpack | cut -c1-16)"
    selection_as first 150
    selection_as second 150
    mixed_table 90 s171 ;;
  *)
    require_gpu H100
    nvrtc_check 80
    extend_pack scripts/device-runs/h100_extensions.json h100_extensions 90
    echo "merged sha256 $(sha256sum /tmp/merged.msgpack | cut -c1-16)"
    rm -f "$OUT/h100_extensions.msgpack"
    selection 140 ;;
esac
