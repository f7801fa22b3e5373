#!/usr/bin/env bash
# run S176b (about 300 s, any Hopper card): S176 cut to what 544 s of device time allows
# (S176 found no machine): one issuing per issue family for a whole exploration, the
# selection twice and the mixed table
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
card_header
selection_as first 125
selection_as second 125
mixed_table 80 s176b
