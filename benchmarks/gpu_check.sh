#!/usr/bin/env bash
# One device call for a change's GPU checks (see CONTRIBUTING.md: run from the project root with
# .whl carried): where CUDA's headers were found, the GPU tests (every `gpu` test, then the CUDA
# header tests whole), logs under $OUT, a short summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/aionvrtc-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD AIONVRTC_CACHE_DIR=/tmp/aionvrtc-cache
# cuda-pathfinder looks in site-packages, not in PYTHONPATH's /tmp/site: where it finds no CUDA
# headers of the host's own, the wheels' are named as a toolkit root.
if ! python3 -c "import sys, cuda.pathfinder as p; sys.exit(p.locate_nvidia_header_directory('cudart') is None)"; then
  export CUDA_PATH=/tmp/site/nvidia/cu13
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.csv" 2>&1
python3 -m aionvrtc doctor --json > "$OUT/doctor.json" 2>&1
python3 -m pytest -p no:cacheprovider -ra -m gpu "$@" > "$OUT/gpu_tests.log" 2>&1
gpu=$?
python3 -m pytest -p no:cacheprovider -ra -s tests/test_cuda_headers.py > "$OUT/cuda_headers.log" 2>&1
headers=$?
echo "== summary =="
cat "$OUT/nvidia-smi.csv"
python3 -c "import json; [print(c['check'], c['status'], c['detail']) for c in json.load(open('$OUT/doctor.json'))['checks'] if c['check'] in ('nvrtc', 'driver', 'gpu 0') or 'headers' in c['check']]"
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" "$OUT/cuda_headers.log" | head -20
grep -E "^seed " "$OUT/cuda_headers.log" | head -5
tail -1 "$OUT/gpu_tests.log"
tail -1 "$OUT/cuda_headers.log"
echo "exit: gpu tests $gpu, cuda headers $headers"
[ "$gpu$headers" = "00" ]
