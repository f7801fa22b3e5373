#!/usr/bin/env bash
# run S143 (about 360 s plus the start, a fresh machine): the twenty-eighth session's tree,
# where a key decided before the start-up pack's first fit is decided again by the model
# (e1e18f6): contention first (S142's decode input was decided cold, 1.14x all run), its
# inputs' first histories, selection twice, the mixed table, contention again
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
contention 110
contention_history
selection 170
selection_second 170
mixed_table 150 w9
contention_again 110
