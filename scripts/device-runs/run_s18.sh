#!/usr/bin/env bash
# run S18 (next session, after S17's pack is copied to adaptive/packs/): why the learned
# dispatcher commits split-KV where SDPA is 8-19% faster (runs S15, S16), as an experiment:
# decode attention with the exploring samples' gate limit at the library's 100 us and at
# 1000 us (each row keeps the policy's sample medians); then the server (issue 12); last,
# the split-KV GPU tests (the shared header of branch skv, 616e6fa, if merged before S17)
source "$(dirname "$0")/setup.sh"
# every shape at 100 us (with skv-mask merged: the padded-batch shapes too); at 1000 us the
# shapes where SDPA won and the padded ones
for gate in 100 1000; do
  t0=$SECONDS
  if [ $gate = 100 ]; then shapes=(); limit=130; else
    shapes=(--shapes "gqa B=1 Lk=,gqa B=8 Lk=4096,gqa B=32,mha,padded"); limit=95; fi
  timeout $limit python3 benchmarks/gpu_decode_attention.py --sample-gate-us $gate "${shapes[@]}" --out /tmp/dec$gate > "$OUT/decode_$gate.log" 2>&1
  echo "decode gate $gate us rc=$? $((SECONDS-t0)) s"
  cp /tmp/dec$gate/decode_attention.json "$OUT/decode_attention_$gate.json" 2>/dev/null
  grep -E "NOT|MET" "$OUT/decode_$gate.log" | grep "SDPA" | cut -c1-120
done
t0=$SECONDS
timeout 240 python3 benchmarks/gpu_server.py --out /tmp/srv --modes torch,adaptive > "$OUT/server.log" 2>&1
echo "server rc=$? $((SECONDS-t0)) s"
cp /tmp/srv/*.json "$OUT/" 2>/dev/null
tail -8 "$OUT/server.log" | cut -c1-400
t0=$SECONDS
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention_splitkv_cuda.py > "$OUT/tests_splitkv.log" 2>&1
echo "splitkv tests rc=$? $((SECONDS-t0)) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_splitkv.log" | cut -c1-300 | head -12
