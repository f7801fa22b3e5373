#!/usr/bin/env bash
# run S129 (at most about 230 s, a fresh machine or after another run): "regime" again, on
# what S128 did not cover: the contention run (S108 under "regime": process load 1.194)
# and a second mixed table (S128's one: every op's wall beat the best fixed's)
source "$(dirname "$0")/setup.sh"
export ADAPTIVE_ISSUE_CHARGE=regime
contention 110 --issue-charge regime
mixed_table 150 regime2
