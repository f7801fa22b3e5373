#!/usr/bin/env bash
# run S128 (at most about 330 s, a fresh machine or after another run): the mixed table
# (re-timed finalists, 16 calls a round) and the selection benchmark under
# ADAPTIVE_ISSUE_CHARGE=regime, against S127's two mixed tables and selection under "sum"
# on the same tree: S127's walls lost spmm (1.12-1.15x the best fixed) and once attention
# (1.196x, SDPA from CuPy committed on 128^2 at 0.021 ms of device time, 0.094 ms a call
# re-timed) where a class whose exploring samples found the device busy was charged no
# issuing; "regime" charges those the larger of device time and issuing (S107/S108 tried
# it against the three-call table, before the re-timed finalists)
source "$(dirname "$0")/setup.sh"
export ADAPTIVE_ISSUE_CHARGE=regime
mixed_table 150 regime
selection 170
