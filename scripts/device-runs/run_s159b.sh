#!/usr/bin/env bash
# run S159, second part: on S159a's pack (copied in from its $OUT), the selection with
# settling off (against S159a's default, on one machine) and the mixed table
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
use_pack
selection 150 --learned settle_margin=None
mixed_table 120 s159
