#!/usr/bin/env bash
# run S150 (about 330 s plus the start, a fresh machine): on S149's pack (flash2_ksplit_mma
# and flash2_pair_mma in it), the example server in both modes and contention again
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
serve_both 290
contention 110
