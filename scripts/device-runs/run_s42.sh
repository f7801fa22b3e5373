#!/usr/bin/env bash
# run S42 (after S44): the patched-llama test with rmsnorm_torch in its registry (S44: its
# registry had no rmsnorm variant); generate() with every candidate, two rounds and two
# lockstep rounds (both models token by token in one thread, so the host's slow phases
# fall on both: S38's request-by-request ratios swung with them); per-request lockstep
# lines are printed as they come; then gpu_hostpath again, its patched norm warmed until
# it holds a plan (S44's 12 warm-up calls left it exploring)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 55 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_integration_fast_paths_cuda.py > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"; tail -1 "$OUT/tests.log" | cut -c1-300
t0=$SECONDS
timeout 425 python3 benchmarks/gpu_generate.py --no-ablation --lockstep-rounds 2 --out /tmp/gen > "$OUT/generate.log" 2>&1
echo "generate rc=$? $((SECONDS-t0)) s"
cp /tmp/gen/gpu_generate.json /tmp/gen/generate_profile_*.txt "$OUT/" 2>/dev/null
grep -E "warm-up [0-9]|rounds batch|lockstep|ratio|tokens/s|greedy|committed" "$OUT/generate.log" | cut -c1-260
t0=$SECONDS
timeout 105 python3 benchmarks/gpu_hostpath.py --out /tmp/hp > "$OUT/hostpath.log" 2>&1
echo "hostpath rc=$? $((SECONDS-t0)) s"; grep -E "RMSNorm|rms" "$OUT/hostpath.log" | cut -c1-200
