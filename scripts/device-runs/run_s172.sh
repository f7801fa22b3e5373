#!/usr/bin/env bash
# run S172 (about 420 s, any Hopper card; the thirty-ninth session's third call): the
# selection under ADAPTIVE_ISSUE_CLOCK=wall (the default) and =thread (the issuing
# charged is the issuing thread's CPU time: a background refit holding the interpreter is
# not counted), interleaved, twice each, on the card's own shipped pack. S168's
# uniform-mix (H200) read softmax R=64 C=32000's four candidates at 2.5-5x their device
# times while the shipped pack was being fitted; S171 (H100) showed young issuing windows
# of 32 us against 10 us once quiet. Each selection's histories name the charges.
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
card_header
ADAPTIVE_ISSUE_CLOCK=wall selection_as wall1 125
ADAPTIVE_ISSUE_CLOCK=thread selection_as thread1 125
ADAPTIVE_ISSUE_CLOCK=wall selection_as wall2 125
ADAPTIVE_ISSUE_CLOCK=thread selection_as thread2 125
