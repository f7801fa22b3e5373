#!/usr/bin/env bash
# run S124 (at most about 190 s, a fresh machine): the noise rule's extra samples only for a
# candidate whose fastest sample is below every other candidate's median (S123's long-burst
# timed four softmax candidates of a 12-call key 6 times each; its tuning runs 10.5%):
# selection, then the mixed table if time is left
source "$(dirname "$0")/setup.sh"
selection 130
if [ "$SECONDS" -lt 120 ]; then mixed_table 60; else echo "mixed table skipped at $SECONDS s"; fi
