#!/usr/bin/env bash
# run S60 (first of its session): after S47/S59 on tree adf8469+. The selection on the
# shipped pack with the widened exploration (S47: learned-shipped long-burst 1.240, SDPA
# committed unseen-flash at B=1 H=8 L=2048-4096), the contention run with each issuing
# charge (S59, "sum": idle 1.163, gemm 2048^3 committed tc_wide at 1.75x cuBLAS), the main
# job's mixed workload at 40 calls an input (S59 at 30: rmsnorm 7.33x, 3 of 4 exploring),
# and the GPU tests of this tree's changes (torch work of CuPy callers on CuPy's stream; a
# sparse layer on spmm's baseline as F.linear)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 90 python3 -m adaptive.cli nvrtc-check --workers 15 --quiet > "$OUT/nvrtc.log" 2>&1
echo "nvrtc rc=$? $((SECONDS-t0)) s"; tail -1 "$OUT/nvrtc.log"
t0=$SECONDS
timeout 40 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_spmm_attention_cuda.py -k cupys_stream > "$OUT/tests.log" 2>&1
echo "stream test rc=$? $((SECONDS-t0)) s"; tail -2 "$OUT/tests.log" | cut -c1-300
t0=$SECONDS
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_integration_fast_paths_cuda.py tests/gpu/test_transformers_cuda.py > "$OUT/tests2.log" 2>&1
echo "integration tests rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/tests2.log" | cut -c1-300
t0=$SECONDS
timeout 110 python3 benchmarks/gpu_selection.py --out "$OUT" > "$OUT/selection.log" 2>&1
echo "selection rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|MATCHED|NOT|first result .* ms: the miss|largest excess|model accuracy|widened" "$OUT/selection.log" | cut -c1-300
t0=$SECONDS   # the A/B of the race: candidates 1.5x the leader left behind (long-burst's
mkdir -p "$OUT/race15"   # tuning runs 13.0% in S47 against the 10% bar)
timeout 110 python3 benchmarks/gpu_selection.py --learned race_ratio=1.5 --out "$OUT/race15" > "$OUT/selection_race15.log" 2>&1
echo "selection race 1.5 rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|MATCHED|NOT" "$OUT/selection_race15.log" | cut -c1-300
for rule in sum max; do
  t0=$SECONDS
  mkdir -p "$OUT/contention_$rule"
  timeout 100 python3 benchmarks/gpu_contention.py --issue-charge $rule --out "$OUT/contention_$rule" > "$OUT/contention_$rule.log" 2>&1
  echo "contention $rule rc=$? $((SECONDS-t0)) s"
  tail -8 "$OUT/contention_$rule.log"
done
t0=$SECONDS
timeout 120 python3 -m adaptive.cli bench mixed --backend cuda > "$OUT/bench_mixed.log" 2>&1
echo "bench mixed rc=$? $((SECONDS-t0)) s"
tail -22 "$OUT/bench_mixed.log" | cut -c1-240
