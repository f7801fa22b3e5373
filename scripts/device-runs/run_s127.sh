#!/usr/bin/env bash
# run S127 (at most about 330 s, a fresh machine or after another run): the mixed table
# priced from each input's finalists re-timed (its table best, the best fixed, adaptive's
# choice, interleaved, median of 11 rounds of 16 calls), twice in two processes for
# repeatability, each with the table's own ratios beside; then the selection benchmark
# once more (unchanged since S124) for the tuning-runs bar's spread
source "$(dirname "$0")/setup.sh"
mixed_table 150 r1
mixed_table 150 r2
selection 170
