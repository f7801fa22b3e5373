#!/usr/bin/env bash
# run S175 (about 470 s, any Hopper card; the fortieth session's second call): the tree S174
# was meant to measure (the key charge's two rules, issue_family) with spmm's refinement
# (a commit whose leader is not the model's first pick times the next config of the
# leader's variant first; Op.refine_configs, spmm's 1): S174 ran on an H100 with an
# ungated draft of it on every op, which put long-burst's tuning runs at 12.2-12.8%. The
# selection twice, the main job's mixed table (rmsnorm: the H200's open row), then the
# selection with race_ratio 1.2 (long-burst's tuning runs, 9.0-10.6% before the draft)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
card_header
selection_as first 125
selection_as second 125
mixed_table 80 s175
selection 125 --learned race_ratio=1.2
