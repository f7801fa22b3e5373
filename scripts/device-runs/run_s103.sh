#!/usr/bin/env bash
# run S103 (at most about 580 s, a fresh machine or after S102): the shipped pack rebuilt
# from the wide preset with 2:4 weights at 64-4096 tokens added (239 cases; S89's 227 took
# 346 s, the 12 new cases up to 4096 tokens each): the kernel cache filled, the pack
# built and copied to $OUT and adaptive/packs/ (commit it from $OUT). Then run_s101.sh
# again on the new pack (the 2:4 dispatcher bar and selection)
source "$(dirname "$0")/setup.sh"
build_pack 440
