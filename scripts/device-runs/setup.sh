# sourced by the run scripts from run S10 on: the carried wheels installed, the paths and
# the kernel cache set, $OUT made
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 ADAPTIVE_CACHE_DIR=/tmp/adaptive-gpu-check-cache
mkdir -p "$OUT"

# the kernel cache filled by the NVRTC check (15 workers), its last line printed:
#   nvrtc_check TIMEOUT
nvrtc_check() {
  local t0=$SECONDS
  timeout "$1" python3 -m adaptive.cli nvrtc-check --workers 15 --quiet > "$OUT/nvrtc.log" 2>&1
  echo "nvrtc rc=$? $((SECONDS-t0)) s"; tail -1 "$OUT/nvrtc.log"
}

# the kernel cache filled for the named variants alone (comma-separated op/name; 15
# workers), its last line printed (from run S155 on): nvrtc_variants TIMEOUT NAMES
nvrtc_variants() {
  local t0=$SECONDS
  timeout "$1" python3 -m adaptive.cli nvrtc-check --workers 15 --quiet --variants "$2" > "$OUT/nvrtc.log" 2>&1
  echo "nvrtc rc=$? $((SECONDS-t0)) s"; tail -1 "$OUT/nvrtc.log"
}

# the kernel cache filled (nvrtc_check), then the shipped pack of this GPU (h200.msgpack on
# an H200; from run S163 on, any card's, named by benchmarks/gpu_pack.py) built into
# /tmp/packout with DEADLINE seconds for its cases and copied to $OUT and adaptive/packs/;
# an unfinished build's journal goes to $OUT too (carry it back into /tmp/packout to
# resume): build_pack DEADLINE [NVRTC_TIMEOUT]
build_pack() {
  nvrtc_check "${2:-90}"
  local t0=$SECONDS pack
  timeout $(($1 + 35)) python3 benchmarks/gpu_pack.py --deadline-s "$1" --out /tmp/packout > "$OUT/pack.log" 2>&1
  echo "pack rc=$? $((SECONDS-t0)) s"
  tail -2 "$OUT/pack.log" | cut -c1-300
  cp /tmp/packout/*.partial "$OUT/" 2>/dev/null
  [ -f /tmp/packout/gpu_pack.json ] || { echo "pack: no gpu_pack.json, the build did not finish"; return 1; }
  pack=$(python3 -c "import json; print(json.load(open('/tmp/packout/gpu_pack.json'))['pack'])")
  cp "/tmp/packout/$pack" /tmp/packout/gpu_pack.json "$OUT/" && cp "/tmp/packout/$pack" adaptive/packs/
  echo "pack $pack sha256 $(sha256sum "/tmp/packout/$pack" | cut -c1-16)"
}

# benchmarks/gpu_server.py on the same requests in both modes, its JSON to $OUT and its
# summary lines printed (from run S39 on): serve_both TIMEOUT
serve_both() {
  local t0=$SECONDS
  timeout "$1" python3 benchmarks/gpu_server.py --out /tmp/srv --modes torch,adaptive > "$OUT/server.log" 2>&1
  echo "server rc=$? $((SECONDS-t0)) s"
  cp /tmp/srv/*.json "$OUT/" 2>/dev/null
  grep -E "serving after|engine:|policy:|misses:|adaptive / torch at" "$OUT/server.log" | cut -c1-240
  grep -E "prefill profile: (batch|route)" "$OUT/server.log" | cut -c1-240
}

# benchmarks/gpu_selection.py into $OUT, its verdict lines printed (from run S79 on):
#   selection TIMEOUT [ARGS...]
selection() {
  local t0=$SECONDS limit=$1; shift
  timeout "$limit" python3 benchmarks/gpu_selection.py "$@" --out "$OUT" > "$OUT/selection.log" 2>&1
  echo "selection rc=$? $((SECONDS-t0)) s"
  grep -E "^steady/oracle over|BEAT|MATCHED|NOT|first result .* ms: the miss|off the calling thread|model accuracy|largest excess|pipelined, " "$OUT/selection.log" | cut -c1-260
}

# benchmarks/gpu_headline.py for CASE with the comma-separated MODES ("all": the case's
# own), its log to $OUT/headline_CASE.log (2:4 as 24), the batches, prefill profiles and
# verdicts printed (from run S81 on; from S85 on, a slow prefill's stacks and the profiled
# prefill's host-time ops and stacks): headline TIMEOUT CASE MODES [ARGS] (ARGS: more of
# gpu_headline.py's options, e.g. --adaptive-graphs)
headline() {
  local t0=$SECONDS log="$OUT/headline_${2/:/}.log" modes=()
  [ "$3" = all ] || modes=(--modes "$3")
  timeout "$1" python3 benchmarks/gpu_headline.py --case "$2" "${modes[@]}" "${@:4}" --out "$OUT" > "$log" 2>&1
  echo "headline $2 rc=$? $((SECONDS-t0)) s"
  grep -E "serving after|decode steps (capture|eager)|decode re-checks|capture FAILED|pooled| misses: |    batch [0-9]+:|prefill stack:|profile: prefill: (batch|host|stack)" "$log" | cut -c1-300
  tail -10 "$log" | cut -c1-300
}

# benchmarks/gpu_generate.py with library kernels only, its log and JSON to $OUT, its
# ratios, ablation and lockstep pairs printed (from run S84 on): generate TIMEOUT [ARGS]
# (ARGS: more of gpu_generate.py's options, e.g. --no-ablation)
generate() {
  local t0=$SECONDS
  timeout "$1" python3 benchmarks/gpu_generate.py --library-only --rounds 1 --lockstep-rounds 2 "${@:2}" --out /tmp/gen > "$OUT/generate.log" 2>&1
  echo "generate rc=$? $((SECONDS-t0)) s"
  cp /tmp/gen/gpu_generate.json "$OUT/" 2>/dev/null
  grep -E "ratio|ablation \(lockstep\)|lockstep request|profile batch|^    .* host +[+-][0-9.]+ ms \(calls" "$OUT/generate.log" | grep -v UserWarning | cut -c1-220
}

# the shipped pack of this GPU (adaptive/packs/h200.msgpack on an H200), its path printed
# (from run S165 on): card_pack
card_pack() {
  python3 -c "from adaptive.dispatch import Dispatcher; from adaptive.packs.install import shipped_packs_for; print(shipped_packs_for(Dispatcher('cuda').backend.fingerprint())[0])"
}

# the inputs of SHAPES (a .json of {op: [...]}) measured as the shipped pack's were, with
# DEADLINE seconds for their cases, merged into the shipped pack of this GPU (card_pack,
# from run S165 on; adaptive/packs/ and $OUT; commit it from $OUT), from run S109 on; with
# VARIANTS (comma-separated names, from run S113 on) only those measured:
#   extend_pack SHAPES NAME DEADLINE [VARIANTS]
extend_pack() {
  local t0=$SECONDS only=() pack
  [ -n "$4" ] && only=(--variants "$4")
  pack=$(card_pack) || return 1
  timeout $(($3 + 30)) python3 -m adaptive.cli pack build --shapes "$1" --backend cuda --warmup 2 --repeats 7 --seed 0 --cubins --deadline-s "$3" --no-progress "${only[@]}" -o "/tmp/$2.msgpack" > "$OUT/$2.log" 2>&1
  echo "$2 build rc=$? $((SECONDS-t0)) s"; tail -3 "$OUT/$2.log" | cut -c1-200
  python3 -m adaptive.cli pack merge -o /tmp/merged.msgpack "$pack" "/tmp/$2.msgpack" > "$OUT/merge.log" 2>&1
  echo "merge rc=$? into $pack"; tail -2 "$OUT/merge.log" | cut -c1-200
  cp /tmp/merged.msgpack "$pack" && cp /tmp/merged.msgpack "/tmp/$2.msgpack" "$OUT/"
}

# benchmarks/gpu_sparse24.py (the 2:4 dispatcher bar, every token count) into $OUT, its
# table, eager loop and targets printed (from run S104 on): sparse24_bar TIMEOUT BUDGET
sparse24_bar() {
  local t0=$SECONDS
  timeout "$1" python3 benchmarks/gpu_sparse24.py --budget-s "$2" --out "$OUT" > "$OUT/sparse24.log" 2>&1
  echo "sparse24 rc=$? $((SECONDS-t0)) s"; sed -n '/^spmm 2:4, float16/,$p' "$OUT/sparse24.log" | cut -c1-220
}

# the main job's mixed table on the GPU into $OUT/bench_mixed.log (from run S104 on; from
# S126 on, a NAME for the log, bench_mixed_NAME.log, and more of bench's options):
#   mixed_table TIMEOUT [NAME ARGS...]
mixed_table() {
  local t0=$SECONDS log="$OUT/bench_mixed${2:+_$2}.log"
  timeout "$1" python3 -m adaptive.cli bench mixed --backend cuda "${@:3}" > "$log" 2>&1
  echo "bench mixed ${*:2} rc=$? $((SECONDS-t0)) s"
  grep -E "^mixed |^all ops|largest excess|the table alone|^[a-z]+ +[0-9]+ +[0-9]+ " "$log" | cut -c1-400
}

# benchmarks/gpu_contention.py into $OUT, its targets and the cuBLAS entries' issuing windows
# printed (from run S120 on; from S129 on, more of its options): contention TIMEOUT [ARGS]
contention() {
  local t0=$SECONDS
  timeout "$1" python3 benchmarks/gpu_contention.py --out "$OUT" "${@:2}" > "$OUT/contention.log" 2>&1
  echo "contention rc=$? $((SECONDS-t0)) s"; tail -12 "$OUT/contention.log" | cut -c1-300
  grep -E "issuings of gemm/cublas|issuings of spmm/cublas_dense" "$OUT/contention.log" | head -4 | cut -c1-200
}

# GPU test files run into $OUT/tests.log, their last lines printed (from run S125 on):
#   gpu_tests TIMEOUT FILE...
gpu_tests() {
  local t0=$SECONDS limit=$1; shift
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider "$@" > "$OUT/tests.log" 2>&1
  echo "tests rc=$? $((SECONDS-t0)) s"; tail -2 "$OUT/tests.log" | cut -c1-300
}

# a benchmark script run into $OUT/NAME.log, its last LINES lines printed (from run S125
# on): probe TIMEOUT NAME LINES SCRIPT [ARGS]
probe() {
  local t0=$SECONDS limit=$1 name=$2 lines=$3; shift 3
  timeout "$limit" python3 "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS-t0)) s"; cut -c1-200 "$OUT/$name.log" | tail -"$lines"
}

# benchmarks/gpu_selection.py a second time in one run, into $OUT/second and
# $OUT/selection2.log, its learned-shipped and unmet lines printed (from run S139 on):
#   selection_second TIMEOUT
selection_second() {
  mkdir -p "$OUT/second"
  local t0=$SECONDS
  timeout "$1" python3 benchmarks/gpu_selection.py --out "$OUT/second" > "$OUT/selection2.log" 2>&1
  echo "selection (second) rc=$? $((SECONDS-t0)) s"
  grep -E "^steady/oracle over|BEAT|NOT|first result .* ms: the miss|off the calling thread|model accuracy" "$OUT/selection2.log" | grep -E "learned-shipped|steady/oracle over|accuracy|BEAT|NOT met" | cut -c1-260
}

# the first condition's history of each contention input (its miss, its first commit),
# from $OUT/contention.json (from run S143 on): contention_history
contention_history() {
  python3 - "$OUT/contention.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("policy stats:", {k: v for k, v in d["policy_stats"].items() if not k.endswith("_s")})
for r in d["conditions"][0]["rows"]:
    print(" ", r["input"], "|", " | ".join(h[:150] for h in r["history"][:3]))
PY
}

# a second contention run, its log to $OUT/contention2.log and its JSON to /tmp (from run
# S143 on): contention_again TIMEOUT [ARGS]
contention_again() {
  local t0=$SECONDS
  timeout "$1" python3 benchmarks/gpu_contention.py --out /tmp/contention2 "${@:2}" > "$OUT/contention2.log" 2>&1
  echo "contention (again) rc=$? $((SECONDS-t0)) s"; tail -10 "$OUT/contention2.log" | cut -c1-300
}

# the merged pack the call before left on this machine (/tmp/merged.msgpack, from
# extend_pack), put in place of the tree's, and the pack's sha256 printed, from run S158b
# on (a fresh machine has none: the tree's pack is used, and its sha tells which)
use_pack() {
  [ -f /tmp/merged.msgpack ] && cp /tmp/merged.msgpack adaptive/packs/h200.msgpack
  echo "pack sha256 $(sha256sum adaptive/packs/h200.msgpack | cut -c1-16)"
}

# stop the run (exit 3) unless the GPU is an H200: the shipped pack is the H200's, and a
# call naming nvidia-h200 may be served by an H100, where learned-shipped does not run and
# a pack extension cannot merge (run S161 on an H100, thirty-seventh session); from run
# S161 on: require_h200
require_h200() {
  require_gpu H200
}

# the GPU's name and its shipped pack's sha256 printed (from run S172 on): card_header
card_header() {
  local pack
  echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  pack=$(card_pack) || return 1
  echo "pack $pack sha256 $(sha256sum "$pack" | cut -c1-16)"
}

# stop the run (exit 3) unless the GPU's name holds NAME (from run S165 on): require_gpu NAME
require_gpu() {
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  case "$name" in
    *"$1"*) echo "gpu: $name" ;;
    *) echo "gpu: $name, not an $1: this run needs the $1's pack; stopped"; exit 3 ;;
  esac
}

# benchmarks/gpu_contention.py with every shipped pack set aside (every key decided cold,
# as on a card with no pack of its compute capability either), its targets, the history of
# each row over the bar and each condition's policy line printed, the packs put back (from
# run S165 on; until the thirty-eighth session's shipped_packs_like, this GPU's pack alone
# was set aside, which then left it cold): contention_cold TIMEOUT [ARGS]
contention_cold() {
  mkdir -p /tmp/aside && mv adaptive/packs/*.msgpack /tmp/aside/ && echo "set aside: $(ls /tmp/aside)"
  contention "$@"
  contention_lines
  mv /tmp/aside/*.msgpack adaptive/packs/
}

# the contention's policy line per condition and the history of each row over the bar
# printed, its large JSON dropped from $OUT (from run S168 on): contention_lines
contention_lines() {
  grep -E "over the bar; its key's history|policy:" "$OUT/contention.log" | cut -c1-1500
  rm -f "$OUT/contention.json"
}

# benchmarks/gpu_selection.py again into $OUT/NAME and $OUT/selection_NAME.log, its overall
# and learned-shipped lines printed (from run S168 on; the environment decides what differs,
# e.g. ADAPTIVE_SIBLING_PACKS=on selection_as siblings 110): selection_as NAME TIMEOUT
selection_as() {
  local t0=$SECONDS
  mkdir -p "$OUT/$1"
  timeout "$2" python3 benchmarks/gpu_selection.py --out "$OUT/$1" > "$OUT/selection_$1.log" 2>&1
  echo "selection ($1) rc=$? $((SECONDS-t0)) s"
  grep -E "^steady/oracle over|shipped pack|model accuracy|learned-shipped:|BEAT|NOT" "$OUT/selection_$1.log" | cut -c1-260
}

# the selection with this GPU's own shipped pack set aside, so that learned-shipped starts
# from the shipped packs of its compute capability, as a GPU with no pack of its own does
# (shipped_packs_like), into $OUT/foreign, the pack put back (from run S168 on):
#   selection_foreign TIMEOUT
selection_foreign() {
  local pack
  pack=$(card_pack) || return 1
  mv "$pack" /tmp/own.msgpack && echo "set aside: $pack"
  selection_as foreign "$1"
  mv /tmp/own.msgpack "$pack"
}

# the merged pack the call before left on this machine (/tmp/merged.msgpack, from
# extend_pack) put in place of this GPU's shipped pack (card_pack), its sha256 printed
# (from run S177b on; use_pack is the H200's alone): use_card_pack
use_card_pack() {
  local pack
  pack=$(card_pack) || return 1
  [ -f /tmp/merged.msgpack ] && cp /tmp/merged.msgpack "$pack"
  echo "pack $pack sha256 $(sha256sum "$pack" | cut -c1-16)"
}
