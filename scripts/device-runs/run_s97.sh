#!/usr/bin/env bash
# run S97 (at most about 560 s, a fresh machine): the two pruned headlines with torch+graphs
# (cuDNN's SDPA on, captured) among the plain ways: in S92 it was the better plain way in
# graphs, and S93/S96 compared against torch-nocudnn+graphs only
source "$(dirname "$0")/setup.sh"
headline 280 bsr10 torch+graphs,torch-nocudnn+graphs,adaptive+graphs
headline 280 2:4 torch+graphs,torch-nocudnn+graphs,adaptive+graphs
