#!/usr/bin/env bash
# run S159 (about 420 s, straight after S158 on the same machine): on S158's pack (copied
# in from S158's $OUT as adaptive/packs/h200.msgpack before the call), the selection twice
# more, the default policy (settle_margin 0.02) and settle_margin off, side by side on one
# machine (what settling buys in long-burst's tuning runs and what it costs in
# steady/oracle), then the main job's mixed table (the issue's per-op bar) with this
# session's policy
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
selection_second 150
selection 150 --learned settle_margin=None
mixed_table 120 s159
