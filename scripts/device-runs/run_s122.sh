#!/usr/bin/env bash
# run S122 (at most about 560 s, a fresh machine): each variant's window of issuings seeded
# on its first three exploring turns, not its first alone (dispatch.ISSUE_SEEDS; S121's
# decode-heavy committed tc_wide at 1.34x cuBLAS on gemm M=16 N=K=2048 after one 31.6 us
# cuBLAS seed, where other streams seeded it at 16-22 us): selection, the mixed table and
# the contention run, then the example server (dense) in both modes if time is left
source "$(dirname "$0")/setup.sh"
selection 150
mixed_table 120
grep -E "adaptive's policy" "$OUT/bench_mixed.log" | head -2
contention 110
# the example server, dense, torch and adaptive on the same requests, if time is left
if [ "$SECONDS" -lt 330 ]; then serve_both 200; else echo "server skipped at $SECONDS s"; fi
