#!/usr/bin/env bash
# run S95 (after another run on its machine, at most about 400 s): the 2:4 headline with
# adaptive's captured decode steps re-checked, one batch in 8 of a state decoded eagerly
# (--graphs-recheck-every 8): what the re-checks cost against S93's tokens/s and how
# often a steady load has a state captured again (the report's "decode re-checks" line)
source "$(dirname "$0")/setup.sh"
headline 380 2:4 torch-nocudnn+graphs,adaptive+graphs --adaptive-server-args "--graphs-recheck-every 8"
