#!/usr/bin/env bash
# run S181 (the forty-second session; about 250 s on an H200, 200 s on an H100). On an
# H200: run S179 itself (the selection on the H200 pack as it is, the pack extended with the
# 16 long prefills, the selection twice on it; commit $OUT/merged.msgpack as
# adaptive/packs/h200.msgpack), S179c to follow on the same machine. On an H100: the tree
# with `Learned.far_refine` (97a54fe) on its first GPU, the selection twice and the
# contention on the extended H100 pack
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) exec bash "$(dirname "$0")/run_s179.sh" ;;
esac
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
card_header
selection_as farrefine 110
contention 110
contention_lines
selection_as farrefine2 110
