#!/usr/bin/env bash
# run S166 (about 300 s, one call, an H100 only: require_gpu H100; after S165): S165's
# contention with the H100's pack set aside again (it crashed in 25 s: two NVML samplers
# read GPM at once; GPM calls now take a process-wide lock), to read exploring samples
# dropped as read past their expired gate on cold keys, then the selection on the
# completed H100 pack (S163 + S165: 258 cases, 17,680 rows)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
require_gpu H100
contention_cold 150
selection 150
