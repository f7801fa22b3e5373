#!/usr/bin/env bash
# run S90 (issued inline on S87's machine, recorded here): the dense headline with
# adaptive's decode steps in CUDA graphs over static caches, against eager torch-nocudnn
source "$(dirname "$0")/setup.sh"
headline 420 dense torch-nocudnn,adaptive --adaptive-graphs 2>&1 | grep -vE "prefill stack|profile: prefill: (host|stack)"
