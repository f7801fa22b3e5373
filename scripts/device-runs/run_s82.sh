#!/usr/bin/env bash
# run S82: the dense headline with all three modes (S80 left torch with cuDNN on out to
# fit its call: adaptive 1.448x and 1.206x torch-nocudnn's tokens/s at 8 and 32 clients)
source "$(dirname "$0")/setup.sh"
nvrtc_check 60
headline 500 dense all
