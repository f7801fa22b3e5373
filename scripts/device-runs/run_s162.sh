#!/usr/bin/env bash
# run S162 (about 130 s, an H200 only): S161's first part alone, for a session with little
# device time left: the contention on the committed pack (S158a's), a row over the bar
# printing its key's recent history (S158b's idle miss: softmax R=2048 C=4096 fp16
# committed warp_row at 3.11x reg_row_cs)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
require_h200
use_pack
contention 110
grep -E "over the bar; its key's history|issuing charged so far" "$OUT/contention.log" | cut -c1-1500
rm -f "$OUT/contention.json"
