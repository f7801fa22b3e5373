#!/usr/bin/env bash
# run S131 (at most about 60 s, a fresh machine or after another run): whether a pinned
# call of the mixed streams' candidates waits for the device (S127/S130 walls: one input
# on sdpa_torch put attention's stream 1.25x behind three_pass pinned everywhere, about
# 140 us a call above its re-timed price; spmm's lost the same way with cublas_dense)
source "$(dirname "$0")/setup.sh"
probe 60 blocking 30 benchmarks/probe_blocking.py
