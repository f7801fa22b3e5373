#!/usr/bin/env bash
# run S110 (at most about 330 s, a fresh machine): the 2:4 pruned headline, both sides in
# CUDA graphs, after this session's dispatcher changes (spmm's dense baseline through
# torch.matmul for tensors, the far-input guard, no collection inside exploring samples,
# the pack with the softmax scores): S97 read 2.013x / 3.910x tokens/s and 0.528x / 0.223x
# per-token p99 against torch+graphs
source "$(dirname "$0")/setup.sh"
headline 300 2:4 torch+graphs,adaptive+graphs
