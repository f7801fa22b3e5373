#!/usr/bin/env bash
# run S168 (about 400 s, at most 560 s by its timeouts, one call, any Hopper card; the
# thirty-ninth session's first):
# on an H200, run S161 (the contention on the H200's pack, the vocabulary softmax into it:
# commit $OUT/merged.msgpack as adaptive/packs/h200.msgpack, then the selection and the
# mixed table on it); on an H100, on its pack with S167's vocabulary rows (18,508 rows):
# the selection (S166's uniform-mix read 1.078 from softmax R=64 C=32000 committed at 1.21x
# before those rows), the main job's mixed table and the contention (exploring samples read
# past their expired gate dropped and counted per condition), then the selection with the
# H100's own pack set aside: learned-shipped then starts from the H200's pack, as a GPU of
# compute capability 9.0 with no pack of its own does (thirty-eighth session; the CPU replay
# of H200 -> H100 read 1.000-1.045 per op against cold's 1.000-1.177), and the selection
# with ADAPTIVE_SIBLING_PACKS=on (the H200's pack beside the H100's own, weighted 0.25; in
# the CPU replay the other card's rows took inputs it measured to 1.000-1.002 per op, and
# moved spmm on inputs neither measured by +0.003 to +0.018)
# The tree also ranks spmm's kernels by geo.tile_fill (the used share of their last tiles;
# thirty-eighth session's CPU replay: the packs' spmm 0.005-0.014 closer to the best).
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$name" in *H200*) echo "gpu: $name"; source "$(dirname "$0")/run_s161.sh"; exit ;; esac
require_gpu H100
pack=$(card_pack)
echo "pack $pack sha256 $(sha256sum "$pack" | cut -c1-16)"
selection 130
mixed_table 80 s168
contention 110
contention_lines
selection_foreign 120
ADAPTIVE_SIBLING_PACKS=on selection_as siblings 120
