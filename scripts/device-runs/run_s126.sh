#!/usr/bin/env bash
# run S126 (at most about 200 s, a fresh machine or after another run): the mixed table
# with 16 calls a timed round (the new default; S125's probe and S123's walls: three a
# round priced issue-bound calls at 3-6x their cost in the stream), then with three (as
# until S125) in a second process on the same machine, each with its stream walls: the
# table whose per-input best runs as the faster stream is the one that prices the stream
source "$(dirname "$0")/setup.sh"
mixed_table 120 b16
mixed_table 120 b3 --table-batch 3
