#!/usr/bin/env bash
# run S93 (after S92 on its machine, at most about 560 s): the 2:4 headline with every mode's
# decode steps in CUDA graphs, torch's 2:4 path among them (S91 left it out: the better
# plain way is the baseline), adaptive's captured decode one step ahead (StaticDecode.run;
# S91: adaptive+graphs 2.389x and 4.338x torch-nocudnn+graphs' tokens/s, SM activity
# 0.626x and 0.589x)
source "$(dirname "$0")/setup.sh"
headline 540 2:4 torch-nocudnn+graphs,torch24-nocudnn+graphs,adaptive+graphs
