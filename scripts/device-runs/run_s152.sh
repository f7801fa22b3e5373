#!/usr/bin/env bash
# run S152 (not run yet; about 380 s plus the start, a fresh machine): the shipped pack's
# cubins of the three flash2 variants compiled again with the device's NVRTC (adopt
# dropped 30 stale ones; commit $OUT/h200.msgpack); long-burst's tuning runs (10.7-11.1% in
# S149 and S151, bar 10%) against a lower race ratio: selection with the default policy, then
# with race_ratio=1.3 (a candidate whose one sample is over 1.3x the leader's median timed no
# further; S151's samples put the saving at up to 27-30 timed calls of long-burst's 267-277),
# in one run; contention again (S150 met four of five). The GPU tests: the refreshed cubins
# install (every one), and flash2_ksplit_mma's results
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
t0=$SECONDS
python3 -m adaptive.cli pack cubins adaptive/packs/h200.msgpack --no-progress \
  --variants attention/flash2_mma,attention/flash2_pair_mma,attention/flash2_ksplit_mma -o /tmp/h200.msgpack > "$OUT/cubins.log" 2>&1
echo "cubins rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/cubins.log"
cp /tmp/h200.msgpack adaptive/packs/h200.msgpack && cp /tmp/h200.msgpack "$OUT/"
gpu_tests 90 tests/gpu/test_pack_cubins_cuda.py tests/gpu/test_spmm_attention_cuda.py -k "cubins or flash2_ksplit"
selection_second 170
selection 170 --learned race_ratio=1.3
contention 110
rm -f "$OUT/contention.json"
