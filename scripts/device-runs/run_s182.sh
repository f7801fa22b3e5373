#!/usr/bin/env bash
# run S182 (the forty-fourth session). On an H200: run S179 itself (about 480 s; commit
# $OUT/merged.msgpack as adaptive/packs/h200.msgpack), S179c to follow on the same machine.
# On an H100 (about 90 s): the mixed table on the extended H100 pack, spmm's refinement
# before every commit (9b814b0) on its first mixed table
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) exec bash "$(dirname "$0")/run_s179.sh" ;;
esac
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
card_header
mixed_table 80 s182
