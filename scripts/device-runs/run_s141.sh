#!/usr/bin/env bash
# run S141 (at most about 180 s plus the start, a fresh machine): the baseline left behind
# on two samples over 1.5 race bars (BASELINE_RACE_FACTOR, was 2): selection (long-burst's
# tuning runs read 9.8-10.2% in S137-S140), then the GPU tests of the dispatcher and the
# integrations on the session's tree
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
selection 170
