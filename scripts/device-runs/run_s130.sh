#!/usr/bin/env bash
# run S130 (at most about 320 s, a fresh machine or after another run): the mixed table
# twice under "sum" with a fourth way in its stream walls, adaptive's choices pinned like
# the oracle and the fixed choice (a pinned launch costs 1.5-2.2 us more than a warm one:
# S126-S129's walls put launch's rmsnorm 7-9% ahead where the re-timed table put it 3-6%
# behind)
source "$(dirname "$0")/setup.sh"
mixed_table 150 w1
mixed_table 150 w2
