#!/usr/bin/env bash
# run S68: the library variants that need torch (sdpa_torch, cusparselt_24) called from
# CuPy through their torch entries on views made without DLPack's stream exchange (S66:
# SDPA from CuPy issued in 83 us, 26 of them in four protocol views), with the refuted-
# ranking widening of f71100b taken back (S67: contention 1.75, gemm M=16/128 committed
# tc_wide at 4x cuBLAS's device time): the GPU tests of those variants, the issuing in parts
# again, the selection, the contention run and the main job's mixed workload
source "$(dirname "$0")/setup.sh"
t0=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_spmm_24_cuda.py "tests/gpu/test_spmm_attention_cuda.py" -k "sdpa or cupys_stream or cusparselt or 24" > "$OUT/tests.log" 2>&1
echo "tests rc=$? $((SECONDS-t0)) s"; grep -E "passed|failed|error" "$OUT/tests.log" | tail -5 | cut -c1-300
t0=$SECONDS
timeout 40 python3 benchmarks/gpu_hostpath.py --cases cupy-attention,cupy-sdpa-parts --out /tmp/hp > "$OUT/hostpath.log" 2>&1
echo "hostpath rc=$? $((SECONDS-t0)) s"; grep -E "held plan|from_dlpack\(x\)|SDPA|copy" "$OUT/hostpath.log" | cut -c1-200
t0=$SECONDS
timeout 120 python3 benchmarks/gpu_selection.py --out "$OUT" > "$OUT/selection.log" 2>&1
echo "selection rc=$? $((SECONDS-t0)) s"
grep -E "^steady/oracle over|BEAT|MATCHED|NOT|first result .* ms: the miss|model accuracy|tuning runs under" "$OUT/selection.log" | cut -c1-300
t0=$SECONDS
timeout 80 python3 benchmarks/gpu_contention.py --out "$OUT/contention" > "$OUT/contention.log" 2>&1
echo "contention rc=$? $((SECONDS-t0)) s"
grep -E "issuing charged" "$OUT/contention.log" | tail -1 | cut -c1-400
tail -8 "$OUT/contention.log"
t0=$SECONDS
timeout 60 python3 -m adaptive.cli bench mixed --backend cuda > "$OUT/bench_mixed.log" 2>&1
echo "bench mixed rc=$? $((SECONDS-t0)) s"
tail -12 "$OUT/bench_mixed.log" | cut -c1-240
