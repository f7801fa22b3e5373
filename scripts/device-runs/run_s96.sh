#!/usr/bin/env bash
# run S96 (at most about 560 s; a fresh machine or after another run): the bsr10 headline
# (10% of the MLP weights' 32x32 blocks kept) with both sides' decode steps in CUDA graphs,
# issue 13's second pruned copy. Its last runs were eager (S56: 1.301x torch-nocudnn's
# tokens/s at 8 clients; S65 cut at 330 s, the adaptive server 166 s to serve)
source "$(dirname "$0")/setup.sh"
headline 540 bsr10 torch-nocudnn+graphs,adaptive+graphs
