#!/usr/bin/env bash
# run S156 (about 330 s plus the start; only after run S155's GPU tests of flash_wgmma
# passed): its rows measured on the 34 attention inputs flash2_ksplit_mma's were (S149) and
# merged into the shipped pack (commit it from $OUT), then its experimental flag dropped in
# this checkout (the same edit to commit with the pack) and selection and contention read
# with flash_wgmma among the candidates
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
extend_pack scripts/device-runs/ksplit_inputs.json wgmma 100 flash_wgmma
rm -f "$OUT/wgmma.msgpack"
sed -i '/^experimental = true$/d' variants/attention/manifest.toml
echo "experimental flags left in the attention manifest: $(grep -c '^experimental' variants/attention/manifest.toml)"
selection 170
contention 110
rm -f "$OUT/contention.json"
