#!/usr/bin/env bash
# run S91: the 2:4 headline with both sides' decode steps in CUDA graphs over static caches
# (S88: adaptive+graphs 8.46x and 6.54x eager torch-nocudnn's tokens/s at 8 and 32 clients,
# a gap of issuing a plain-PyTorch user closes by capturing decode steps too; so the
# baseline here is torch-nocudnn+graphs), on a fresh machine with ~350 s of device time
source "$(dirname "$0")/setup.sh"
headline 330 2:4 torch-nocudnn+graphs,adaptive+graphs
