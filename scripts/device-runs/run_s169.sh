#!/usr/bin/env bash
# run S169 (about 200 s, an H100 only: require_gpu H100): the inputs the H200's pack has
# and the H100's lacks (h100_extensions.json: 10 causal MHA prefills of causal_prefill_mha
# and the other attention sets, 8 spmm 2:4 inputs at density 0.5), measured into the
# H100's pack. A CPU replay with the H200's rows of such inputs beside the H100 pack's
# read spmm 1.033 -> 1.010 (85 -> 94% within 5%; thirty-eighth session). Commit
# $OUT/merged.msgpack as adaptive/packs/h100-80gb-hbm3.msgpack.
source "$(dirname "$0")/setup.sh"
require_gpu H100
nvrtc_check 80
extend_pack scripts/device-runs/h100_extensions.json h100_extensions 90
echo "merged sha256 $(sha256sum /tmp/merged.msgpack | cut -c1-16)"
rm -f "$OUT/h100_extensions.msgpack"
