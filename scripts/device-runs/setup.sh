# sourced by the run scripts from run S10 on: the carried wheels installed, the paths and
# the kernel cache set, $OUT made
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 ADAPTIVE_CACHE_DIR=/tmp/adaptive-gpu-check-cache
mkdir -p "$OUT"
