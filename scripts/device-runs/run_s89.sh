#!/usr/bin/env bash
# run S89: the shipped pack rebuilt with the wide preset's decode-projection grid (M 1, 2, 8
# at seven common widths: 21 gemm cases more, 215 in all; S79's 194 cases took 302 s), the
# deadline raised to fit them; then selection once on it (S83: decode-heavy's loss was
# gemm M=1 N=K=2048, a shape the pack did not cover)
source "$(dirname "$0")/setup.sh"
build_pack 380
selection 100
