#!/usr/bin/env bash
# run S123 (at most about 280 s, a fresh machine): S122's selection and mixed table again on
# the same tree, to see whether its results (every selection bar met, the mixed table beat
# on four ops and matched on gemm) hold from one run to the next
source "$(dirname "$0")/setup.sh"
selection 150
mixed_table 120
