#!/usr/bin/env bash
# run S118 (at most about 560 s, a fresh machine, after S117 or alone): the kept-plan
# cuSPARSELt variant as the 2:4 baseline in place of torch's call (same kernels, no plan a
# call): the 2:4 bar (S113: torch's call committed at 4096x14336 N=256 and 4096x4096 N=512
# read 0.04-0.08x the better way in the eager loop) and the 2:4 headline in graphs (S115:
# 21 ms of host a prefill in torch's plans; tokens/s 1.93x / 3.81x against torch+graphs)
source "$(dirname "$0")/setup.sh"
sparse24_bar 240 170
headline 300 2:4 torch+graphs,adaptive+graphs
