#!/usr/bin/env bash
# run S170 (about 420 s, an H200 only, right after S168 ran S161 on it; S161's
# $OUT/merged.msgpack carried as adaptive/packs/h200.msgpack): the selection again on
# that pack (a second sample of S161's), the selection with ADAPTIVE_SIBLING_PACKS=on
# (the H100's pack beside the H200's own, weighted 0.25) and the contention again (its
# policy lines and any row over the bar's history)
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
require_h200
echo "pack sha256 $(sha256sum adaptive/packs/h200.msgpack | cut -c1-16)"
selection_as again 150
ADAPTIVE_SIBLING_PACKS=on selection_as siblings 150
contention 110
contention_lines
