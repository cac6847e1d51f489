#!/usr/bin/env bash
# The device machine's one script (see ../shared/DEVICE.md): the whole test suite with the GPU
# tests, then the GPU and compile-service benchmarks. Full logs and results under $OUT; a short
# summary last. Run from the project root with .whl carried:
#   bash benchmarks/gpu_suite.sh [pytest args...]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/aionvrtc-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD
export AIONVRTC_CACHE_DIR=/tmp/aionvrtc-cache

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.csv" 2>&1
python3 -m pytest -p no:cacheprovider -ra "$@" 2>&1 | tee "$OUT/pytest.log"
tests=${PIPESTATUS[0]}
python3 benchmarks/gpu_start.py --out "$OUT" > "$OUT/gpu_start.log" 2>&1
start=$?
gpu=$(head -2 "$OUT/nvidia-smi.csv" | tail -1 | cut -d, -f1)
python3 benchmarks/compile_service.py --machine "$gpu host, $(nproc) CPUs" --out "$OUT" \
  > "$OUT/compile_service.log" 2>&1
service=$?

echo "== summary =="
cat "$OUT/nvidia-smi.csv"
tail -1 "$OUT/pytest.log"
cat "$OUT"/gpu_start-*.md 2>/dev/null || tail -30 "$OUT/gpu_start.log"
cat "$OUT"/compile_service-*.md 2>/dev/null || tail -30 "$OUT/compile_service.log"
echo "exit: tests $tests, gpu_start $start, compile_service $service"
[ "$tests$start$service" = "000" ]
