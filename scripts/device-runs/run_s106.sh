#!/usr/bin/env bash
# run S106 (at most about 330 s, a fresh machine): S104 again with the issuing charge back
# to "sum" (S104's "measured" read ungated pairs at 0.3-6 ms for 0.03-0.1 ms kernels and
# lost on every selection stream), spmm's dense baseline through torch.matmul kept; first
# a probe of what an ungated pair reads after a synchronise (benchmarks/probe_ungated.py)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 60 python3 benchmarks/probe_ungated.py > "$OUT/probe.log" 2>&1
echo "probe rc=$? $((SECONDS-t0)) s"; cut -c1-200 "$OUT/probe.log" | tail -12
sparse24_bar 230 190
selection 100
mixed_table 100
