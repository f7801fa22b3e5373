#!/usr/bin/env bash
# run S138 (at most about 280 s plus the start, a fresh machine): S137's contention died of
# a segmentation fault in its first "timing every candidate" (rc 139, no traceback): again
# with Python's fault handler on (every thread's stack to contention.log on a fault); the
# SDPA probe first (S137's host issued 1.5-1.8x slower than S136's: a gauge of this one),
# then selection again (S137's first results 5.52 / 4.24 / 5.97 ms on that slow host)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
probe 90 sdpa_issue 60 benchmarks/probe_sdpa_issue.py
contention 110
selection 170
