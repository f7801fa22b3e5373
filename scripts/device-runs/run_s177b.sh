#!/usr/bin/env bash
# run S177b (about 330 s, the machine S177 left warm): the extended pack S177 merged put in
# place, the selection a second time on it, the mixed table and the contention. On a fresh
# machine (no /tmp/merged.msgpack) the tree's pack is used, and the sha256 says which
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
card_header
use_card_pack
selection_as extended2 125
mixed_table 80 s177b
contention 110
