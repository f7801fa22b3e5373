#!/usr/bin/env bash
# run S174 (about 480 s, any Hopper card; the fortieth session's first call): the key
# charge's two rules on the card's shipped pack (nothing charged before 3 keys have joined
# a class, nor once its keys recur: S172's H200 uniform-mix committed block_row on softmax
# R=64 C=32000 at 1.15-1.22x in three runs of four from a second key's preparation, and
# long-burst's softmax classes paid 2.5-9 us a call for keys that kept coming back; S173
# ran the first rule on an H100 only), and compiled kernels launched with the same
# arguments sharing one window of issuings (issue_family; S172: same-argument kernels'
# windows 7.5-32 us apart, the decode stream's busiest input committed splitkv2_mma at
# 1.07-1.08x splitkv_mma): the selection twice, the main job's mixed table and the
# contention (its policy lines and any row over the bar's history); then the selection with
# race_ratio 1.2 (long-burst's tuning runs read 9.0-10.6% of autotune's over ten runs, bar
# 10%; the H200 pack's replay with 5% noise: attention 8.7 -> 8.2%, softmax 6.1 -> 5.7%,
# one attention input lost on one dealing of two)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
card_header
selection_as first 125
selection_as second 125
mixed_table 80 s174
contention 110
contention_lines
selection 125 --learned race_ratio=1.2
