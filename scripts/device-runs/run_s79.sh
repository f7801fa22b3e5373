#!/usr/bin/env bash
# run S79: the shipped pack rebuilt with the wide preset's softmax rows as a transformer
# makes them (a42e47e: 16 more softmax inputs, 194 cases; S75's model never explored reg_row on
# R=16384 C=2048 and committed block_row at 1.8x its time: the pack had no row with
# R >= 4096 and C of 1-8k), then gpu_selection.py on it. Bring $OUT/h200.msgpack back and
# commit it if pack.log shows every case built (S72: 178 cases in 270.8 s)
source "$(dirname "$0")/setup.sh"
build_pack 330
selection 105
