#!/usr/bin/env bash
# run S107 (at most about 300 s, a fresh machine): selection twice, the issuing charge "sum"
# (the default; S106's selection ran out of its 100 s) and then "regime" ("sum" where the
# class's device waited, the larger of device time and issuing where it was busy), each
# log kept
source "$(dirname "$0")/setup.sh"
selection 140
mv "$OUT/selection.log" "$OUT/selection_sum.log"; mv "$OUT/gpu_selection.json" "$OUT/gpu_selection_sum.json"
ADAPTIVE_ISSUE_CHARGE=regime selection 140
