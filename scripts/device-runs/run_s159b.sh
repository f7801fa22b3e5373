#!/usr/bin/env bash
# run S159, second part: on S159a's pack (copied in from its $OUT), the selection with
# settling off (against S159a's default, on one machine), the mixed table, and the
# contention again (S158b's idle condition read 1.205: softmax R=2048 C=4096 fp16 committed
# warp_row at 3.1x reg_row_cs; does it repeat?); about 380 s
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
require_h200
use_pack
selection 150 --learned settle_margin=None
mixed_table 120 s159
contention 110
rm -f "$OUT/contention.json"
