#!/usr/bin/env bash
# run S94 (at most about 440 s; after another run on its machine): generate() with library
# kernels only, one round, three lockstep rounds (issue 12: batch 16's lockstep per-token
# p99 read 1.018 in S84 and 1.117 in S87, each over 4 requests; here 6), no ablation
source "$(dirname "$0")/setup.sh"
generate 420 --no-ablation --lockstep-rounds 3
