#!/usr/bin/env bash
# run S176c (about 220 s, any Hopper card): the selection twice with one issuing per issue
# family for a whole exploration (S176 and S176b found no machine; 454 s of device time left)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
card_header
selection_as first 125
selection_as second 125
