#!/usr/bin/env bash
# run S134 (at most about 330 s, a fresh machine or after another run): the session's last
# tree (the model's refit at nice 19; the mixed table's re-timed finalists and four-way
# walls): selection once more under "sum" (S127 the only one this session), then a third
# mixed table with the choices pinned in the walls
source "$(dirname "$0")/setup.sh"
selection 170
mixed_table 150 w3
