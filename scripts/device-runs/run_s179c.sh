#!/usr/bin/env bash
# run S179c (about 330 s, an H200 only, on the machine S179 left warm): the H200 pack S179
# merged put in place (use_card_pack; a fresh machine has none and uses the tree's pack:
# the sha256 says which), the selection a third time, the mixed table and the contention
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
require_h200
card_header
use_card_pack
selection_as extended3 110
mixed_table 80 s179c
contention 110
