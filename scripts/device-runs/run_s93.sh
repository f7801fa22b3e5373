#!/usr/bin/env bash
# run S93 (after S92 on its machine, at most about 400 s): the 2:4 headline with both sides'
# decode steps in CUDA graphs again, adaptive's now one step ahead (StaticDecode.run;
# S91: adaptive+graphs 2.389x and 4.338x torch-nocudnn+graphs' tokens/s, SM activity
# 0.626x and 0.589x). torch's 2:4 path is left out: its linear hands cuSPARSELt x's
# transposed view, 0.26-7 s of host time a call at 4-8k tokens (S85), and it served 84.6
# tokens/s to torch-nocudnn's 449.7 at 8 clients (S61): a 32-client load of it would not
# fit the call
source "$(dirname "$0")/setup.sh"
headline 380 2:4 torch-nocudnn+graphs,adaptive+graphs
