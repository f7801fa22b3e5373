#!/usr/bin/env bash
# run S139 (at most about 500 s plus the start, a fresh machine): the session's last tree,
# every GPU bar of issue 14 once more with Python's fault handler on (S137's segmentation
# fault): selection, the mixed table, contention, then selection a second time (its bars
# sit near their thresholds from run to run: S122-S138)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
selection 170
mixed_table 150 w6
contention 110
selection_second 170
