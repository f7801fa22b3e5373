#!/usr/bin/env bash
# run S133 (at most about 60 s, a fresh machine or after another run): the mixed attention
# stream pinned, three_pass everywhere against sdpa_torch on one input at a time, with and
# without the garbage collector, and the host's us a call per input in each way (S130: one
# sdpa_torch input cost the stream ~150 us a call more than its re-timed price said)
source "$(dirname "$0")/setup.sh"
probe 90 stream_mix 16 benchmarks/probe_stream_mix.py
