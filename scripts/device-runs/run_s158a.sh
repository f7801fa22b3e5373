#!/usr/bin/env bash
# run S158, first part (run_s158.sh split in two for the 600 s call limit): flash_wgmma
# measured on the shipped pack's 32 decodes it has no rows on, merged into the pack; then
# the example server in both modes on that pack
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
echo "pack sha256 $(sha256sum adaptive/packs/h200.msgpack | cut -c1-16)"
extend_pack scripts/device-runs/wgmma_rest.json wgmma_rest 80 flash_wgmma
echo "merged sha256 $(sha256sum /tmp/merged.msgpack | cut -c1-16)"
rm -f "$OUT/wgmma_rest.msgpack" "$OUT/merge.log"
serve_both 290
