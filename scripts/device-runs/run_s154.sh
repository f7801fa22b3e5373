#!/usr/bin/env bash
# run S154 (about 420 s plus the start): the example server in both modes and the mixed
# table with new input classes decided off the calling thread
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
serve_both 290
mixed_table 120 w10
