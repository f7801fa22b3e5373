#!/usr/bin/env bash
# run S119 (at most about 310 s, after S118 on its machine or a fresh one): selection with
# every policy's candidates made before its stream (Dispatcher.prepare_candidates; S116's
# first result 3.17 / 2.43 / 5.96 ms, S114's 3.01 / 2.68 / 3.88) and spmm's work made once
# per weight form, then the mixed table with the 2:4 baseline change and the noise rule's
# extra samples given their turns (Policy.samples_wanted: in S116 the dispatcher held them
# for 4n untimed calls each; S116: all ops 1.058 against best-fixed 1.096; spmm 1.269
# against 1.120, rmsnorm 1.028 against 1.025 with one input still exploring)
source "$(dirname "$0")/setup.sh"
selection 130
mixed_table 170
