#!/usr/bin/env bash
# run S81: the 2:4 headline again with a Python-level profile of the profiled prefill
# (S76: adaptive's 2:4 prefill of 8 rows took 157.7 ms of wall against 35.6 ms of device
# time and 18.9 ms of host time in torch's ops, the dense model's 27.1 ms with the same
# routes; no race, miss or exploring call inside it). The "python" lines name the
# functions with the most time of their own
source "$(dirname "$0")/setup.sh"
nvrtc_check 60
headline 500 2:4 torch-nocudnn,adaptive
