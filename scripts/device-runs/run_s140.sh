#!/usr/bin/env bash
# run S140 (at most about 380 s plus the start, a fresh machine): the session's last tree,
# with a miss's listing 2-4x faster (Variant.fitting filtered by requirement, bd78d00):
# selection twice (first results against S137-S139's), the mixed table, contention, the
# fault handler on
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
selection 170
selection_second 170
mixed_table 150 w7
contention 110
