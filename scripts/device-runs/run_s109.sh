#!/usr/bin/env bash
# run S109 (at most about 330 s, a fresh machine): the wide preset's new grid of attention-
# score softmax inputs (scripts/device-runs/softmax_scores.json: R*C >= 2^24, 1-8k columns;
# the shipped pack had 2 float16 inputs there and S107-S108 committed warp_row on softmax
# 32768x4096 at 1.55x reg_row) measured and merged into the shipped pack, then selection
source "$(dirname "$0")/setup.sh"
extend_pack scripts/device-runs/softmax_scores.json scores 120
selection 110
