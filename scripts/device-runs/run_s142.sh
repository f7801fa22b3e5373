#!/usr/bin/env bash
# run S142 (not run yet; at most about 450 s plus the start, a fresh machine): the
# twenty-seventh session's last tree, where a candidate's hash is made once (af88d65) on top
# of S141's tree: selection twice (first results: S141 read 3.73 / 3.95 / 5.23 ms), the
# mixed table and contention, the fault handler on
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
selection 170
selection_second 170
mixed_table 150 w8
contention 110
