#!/usr/bin/env bash
# run S109 (at most about 330 s, a fresh machine): the wide preset's new grid of attention-
# score softmax inputs (scripts/device-runs/softmax_scores.json: R*C >= 2^24, 1-8k columns;
# the shipped pack had 2 float16 inputs there and S107-S108 committed warp_row on softmax
# 32768x4096 at 1.55x reg_row) measured and merged into the shipped pack, then selection
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 150 python3 -m adaptive.cli pack build --shapes scripts/device-runs/softmax_scores.json --backend cuda --warmup 2 --repeats 7 --seed 0 --cubins --deadline-s 120 --no-progress -o /tmp/scores.msgpack > "$OUT/scores.log" 2>&1
echo "scores build rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/scores.log" | cut -c1-200
python3 -m adaptive.cli pack merge -o /tmp/merged.msgpack adaptive/packs/h200.msgpack /tmp/scores.msgpack > "$OUT/merge.log" 2>&1
echo "merge rc=$?"; tail -2 "$OUT/merge.log" | cut -c1-200
cp /tmp/merged.msgpack adaptive/packs/h200.msgpack && cp /tmp/merged.msgpack /tmp/scores.msgpack "$OUT/"
selection 110
