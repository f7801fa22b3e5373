#!/usr/bin/env bash
# run S163 (about 540 s, one call): on an H200, run S161; on any other card (a call naming
# nvidia-h200 may be served by an H100: thirty-seventh session), that card's shipped pack
# built from the wide preset (benchmarks/gpu_pack.py, as the H200's first was), so that
# learned-shipped, the contention and the mixed table run there with a pack for the card
# (run S164). Commit $OUT/<card>.msgpack as adaptive/packs/<card>.msgpack.
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$name" in *H200*) echo "gpu: $name"; source "$(dirname "$0")/run_s161.sh"; exit ;; esac
echo "gpu: $name: its pack built"
build_pack "${PACK_DEADLINE:-390}" "${NVRTC_TIMEOUT:-100}"
