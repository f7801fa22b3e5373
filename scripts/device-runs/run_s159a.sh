#!/usr/bin/env bash
# run S159, first part of two (split for the 600 s call limit; the second: run_s159b.sh).
# The whole run:
# (S158 ran in the thirty-sixth session and its merged pack is the committed one, which
# use_pack keeps on a fresh machine; on a warm one it takes the call before's /tmp pack)
# run S159 (about 540 s, straight after S158 on the same machine): on S158's pack (copied
# in from S158's $OUT as adaptive/packs/h200.msgpack before the call), first the
# vocabulary softmax at serving batch sizes measured into it (softmax_vocab.json: 22
# inputs, 828 rows; the pack had no fp16 input of C in 18,278-50,256, where reg_row and
# reg_row_cs still fit at C <= 32768, and none of R in 23-386 with C >= 10,000: run S156's
# uniform-mix committed block_row at 1.16x reg_row_cs on softmax R=64 C=32000, 0.706 ms of
# that stream's 1.076 ms excess; the grid leaves out the selection's and the mixed
# table's own inputs, R = 1, 8, 64, 262); then the selection twice more, the default
# policy (settle_margin 0.02) and settle_margin off, side by side on one machine (what
# settling buys in long-burst's tuning runs and what it costs in steady/oracle), then the
# main job's mixed table (the issue's per-op bar) with this session's policy
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
use_pack
extend_pack scripts/device-runs/softmax_vocab.json softmax_vocab 110
echo "merged sha256 $(sha256sum /tmp/merged.msgpack | cut -c1-16)"
rm -f "$OUT/softmax_vocab.msgpack" "$OUT/merge.log"
selection_second 150
