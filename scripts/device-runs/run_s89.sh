#!/usr/bin/env bash
# run S89: the shipped pack rebuilt with the wide preset's additions (a grid of decode
# projections, M 1, 2, 8 at seven common widths; float32 projections and pruned weights:
# 227 cases, S79's 194 took 302 s), the deadline raised to fit them; then selection once
# on it (S83: decode-heavy's loss was gemm M=1 N=K=2048, a shape the pack did not cover;
# the main job's float32 spmm choices 1.555x the oracle with no float32 spmm row in it)
source "$(dirname "$0")/setup.sh"
build_pack 390
selection 90
