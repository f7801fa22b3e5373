#!/usr/bin/env bash
# run S151 (about 300 s plus the start, a fresh machine): the narrowed spaces of
# flash2_ksplit_mma (NWARPS=2) and flash2_pair_mma (NWARPS=2, 4) on the pruned pack:
# selection twice, the mixed table, contention
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
selection 170
selection_second 170
mixed_table 120 w10
contention 110
rm -f "$OUT/contention.json"
