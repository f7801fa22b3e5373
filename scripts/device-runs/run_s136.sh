#!/usr/bin/env bash
# run S136 (at most about 330 s plus the start, a fresh machine): the mixed table and
# contention on the twenty-sixth session's last tree, the baseline now left behind on two
# samples over twice the race bar (S135 ran selection only on it): the mixed table's
# re-timed verdicts and pinned walls (S134 on the tree before: four ops beat, gemm
# matched), contention's five conditions under "sum" (S121/S122: four of five); then
# where SDPA's host time goes when called from CuPy (benchmarks/probe_sdpa_issue.py)
source "$(dirname "$0")/setup.sh"
probe 90 sdpa_issue 60 benchmarks/probe_sdpa_issue.py
mixed_table 150 w4
contention 110
