#!/usr/bin/env bash
# run S44 (next session, FIRST: before S42/S43, whose patched models now serve their norms
# through op rmsnorm): the new op's GPU tests (every rms_rows config x dtype, the value
# regimes, the baseline against LlamaRMSNorm bit for bit, a patched norm on CUDA tensors),
# the integration's GPU tests, then gpu_hostpath (LlamaRMSNorm against AdaptiveRMSNorm and
# the op's candidates held, host and device us per call, decode and prefill rows)
source "$(dirname "$0")/setup.sh"
t0=$SECONDS   # the kernel cache filled first, 15 compiles at a time (198 rms_rows kernels)
timeout 90 python3 -m adaptive.cli nvrtc-check --op rmsnorm --workers 15 --quiet > "$OUT/nvrtc.log" 2>&1
echo "nvrtc rc=$? $((SECONDS-t0)) s"; tail -1 "$OUT/nvrtc.log"
t0=$SECONDS
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_rmsnorm_cuda.py tests/gpu/test_transformers_cuda.py tests/gpu/test_integration_fast_paths_cuda.py > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"; tail -5 "$OUT/tests.log" | cut -c1-300
grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20 | cut -c1-250
t0=$SECONDS
timeout 150 python3 benchmarks/gpu_hostpath.py --out "$OUT" > "$OUT/hostpath.log" 2>&1
echo "hostpath rc=$? $((SECONDS-t0)) s"; grep -E "RMSNorm|rms|case " "$OUT/hostpath.log" | cut -c1-200
