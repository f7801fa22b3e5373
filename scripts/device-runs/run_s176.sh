#!/usr/bin/env bash
# run S176 (about 420 s, any Hopper card; the fortieth session's third call): one issuing
# per issue family for a whole exploration (_InputClass.issue_held). S175 (H100) charged
# configs of one launcher 15-27 us apart within one class as the family's least recent
# issuing moved, and its third selection committed splitkv2_mma at 1.16x splitkv_mma on
# the decode stream's busiest input (decode-heavy 1.054). The selection three times, the
# mixed table (rmsnorm: 1.005 against pinning's 1.001 in S175), the contention
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
card_header
selection_as first 125
selection_as second 125
selection_as third 125
mixed_table 80 s176
contention 110
