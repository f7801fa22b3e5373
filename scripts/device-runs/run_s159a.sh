#!/usr/bin/env bash
# run S159, first part (run_s159.sh split in two for the 600 s call limit): on S158's pack,
# the vocabulary softmax measured into it, then the selection (default policy)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
use_pack
extend_pack scripts/device-runs/softmax_vocab.json softmax_vocab 110
echo "merged sha256 $(sha256sum /tmp/merged.msgpack | cut -c1-16)"
rm -f "$OUT/softmax_vocab.msgpack" "$OUT/merge.log"
selection_second 150
