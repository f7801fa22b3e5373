#!/usr/bin/env bash
# run S85: adaptive's 2:4 serving alone, to find where its prefills go (S81: 6.4 and
# 10.4 s of engine-thread CPU at 32 clients, no miss, race, exploring call or refit inside;
# its profiled prefill 678 ms of host time in torch's ops). Each slow prefill now prints
# the engine thread's busiest stacks (engine.StackSampler: that thread only, unlike
# Python 3.12's cProfile), and the profiled prefill its ops by host time of their own
source "$(dirname "$0")/setup.sh"
nvrtc_check 60
headline 470 2:4 adaptive
