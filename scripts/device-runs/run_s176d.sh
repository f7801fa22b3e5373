#!/usr/bin/env bash
# run S176d (about 110 s, any Hopper card): the selection once with one issuing per issue
# family for a whole exploration (S176-S176c found no machine; 349 s of device time left)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
card_header
selection_as first 125
