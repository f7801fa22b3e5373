#!/usr/bin/env bash
# run S158, second part: on S158a's pack (copied in from its $OUT), the selection and
# contention with this tree's policy and features
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
use_pack
selection 150
contention 110
rm -f "$OUT/contention.json"
