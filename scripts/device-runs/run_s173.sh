#!/usr/bin/env bash
# run S173 (about 200 s, any Hopper card; the thirty-ninth session's last call): the
# selection twice on the card's shipped pack, a host-bound class now charged its
# candidates' preparation of a key only once KEY_CHARGE_KEYS (3) keys have joined it
# (S172: softmax R=1 and R=64 at C=32000, one class, charged reg_row 0.018-0.040 ms a
# call for the one key that joined, and committed block_row at 1.15-1.22x in three runs
# of four)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
card_header
selection_as keys1 125
selection_as keys2 125
