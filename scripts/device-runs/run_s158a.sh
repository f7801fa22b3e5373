#!/usr/bin/env bash
# run S158, first part of two (split for the 600 s call limit; the second: run_s158b.sh).
# The whole run:
# run S158 (about 440 s plus the start): flash_wgmma measured on the shipped pack's 32
# attention inputs it has no rows on (all decodes, Lq <= 16: in the CPU replay of the
# shipped pack, a held-out decode B=32 H=32 Lk=80 D=128 explored two flash_wgmma configs in
# place of decode_global's and committed splitkv_mma at 1.98x its best, in 3 dealings of 4;
# 1.11-1.28x before flash_wgmma was listed), merged into the pack (commit $OUT's); then the
# example server in both modes (flash_wgmma listed, with its grouped-query prefill rows of
# S157), selection and contention on that pack; the learned policy commits once settled
# within 2% (settle_margin 0.02, new default: fewer tuning runs) and, far from every
# measured input, explores each variant's best config before any variant's second and
# its next configs unlike its first (both
# from the thirty-fourth session), and the cost model reads each kernel candidate's flops
# per CTA and per launched thread (thirty-fifth session): all three unmeasured on the GPU
# until this run
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
echo "pack sha256 $(sha256sum adaptive/packs/h200.msgpack | cut -c1-16)"
extend_pack scripts/device-runs/wgmma_rest.json wgmma_rest 80 flash_wgmma
echo "merged sha256 $(sha256sum /tmp/merged.msgpack | cut -c1-16)"
rm -f "$OUT/wgmma_rest.msgpack" "$OUT/merge.log"
serve_both 290
