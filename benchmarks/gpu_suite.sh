#!/usr/bin/env bash
# The GPU machine's one script (see CONTRIBUTING.md): the whole test suite with the GPU
# tests, then benchmarks. Full logs and results under $OUT; a short summary last. Run from the
# project root with .whl carried:
#   bash benchmarks/gpu_suite.sh [pytest args...]           tests, start-up and compile service
#   bash benchmarks/gpu_suite.sh tropical [pytest args...]  tests, tropical GEMM (tiles: TILES)
#   SWEEP=1 bash benchmarks/gpu_suite.sh tropical ...       tile sweep first, GEMM on its winners
#   (WARM=1 before any mode: every tropical kernel compiled first, in parallel)
#   bash benchmarks/gpu_suite.sh check [pytest args...]     a change's GPU checks: the tests given
#                                                           (-m gpu and all they name), doctor
#   bash benchmarks/gpu_suite.sh roofline [pytest args...]  the checks given, then the networks'
#                                                           step profiles (einsum_roofline.py)
#   bash benchmarks/gpu_suite.sh counting [pytest args...]  the checks given, then counted products
#                                                           and counting's networks (SMALL=1: small;
#                                                           NETWORKS="w ...": those named so;
#                                                           PRODUCTS=0: no products)
#   bash benchmarks/gpu_suite.sh slices [pytest args...]    the checks given, then the published
#                                                           problems whole and in slices, with each
#                                                           slice's program (SMALL=1: small)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/aionvrtc-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD
export AIONVRTC_CACHE_DIR=/tmp/aionvrtc-cache
# cuda-pathfinder looks in site-packages, not in PYTHONPATH's /tmp/site: where it finds no CUDA
# headers of the host's own, the carried wheels' are named as a toolkit root.
if ! python3 -c "import sys, cuda.pathfinder as p; sys.exit(p.locate_nvidia_header_directory('cudart') is None)"; then
  export CUDA_PATH=/tmp/site/nvidia/cu13
fi
mode=service
case "${1:-}" in tropical | check | roofline | counting | slices) mode=$1; shift ;; esac

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.csv" 2>&1
python3 -m aionvrtc doctor --json > "$OUT/doctor.json" 2>&1
if [ $mode != service ] && [ $mode != tropical ]; then set -- -m gpu "$@"; fi
# WARM=1: every tropical kernel compiled first, on every CPU, into the cache the tests and
# benchmarks read (a minute on 16 CPUs), rather than one at a time as each call first needs it.
if [ "${WARM:-0}" = 1 ]; then
  python3 -m aionvrtc warm tropical --arch sm_90 --jobs "$(nproc)" > "$OUT/warm.log" 2>&1
fi
timeout "${TESTS_TIMEOUT:-3000}" python3 -m pytest -p no:cacheprovider -ra "$@" > "$OUT/pytest.log" 2>&1
tests=$?
gpu=$(head -2 "$OUT/nvidia-smi.csv" | tail -1 | cut -d, -f1)
if [ $mode = check ]; then
  first=0 second=0
elif [ $mode = slices ]; then
  small=()
  if [ "${SMALL:-0}" = 1 ]; then small=(--small); fi
  python3 benchmarks/sliced_programs.py "${small[@]}" --out "$OUT" > "$OUT/sliced_programs.log" 2>&1
  first=$? second=0
elif [ $mode = counting ]; then
  first=0
  if [ "${PRODUCTS:-1}" = 1 ]; then
    python3 benchmarks/counted_products.py --out "$OUT" > "$OUT/counted_products.log" 2>&1
    first=$?
  fi
  small=() only=()
  if [ "${SMALL:-0}" = 1 ]; then small=(--small); fi
  if [ -n "${NETWORKS:-}" ]; then read -ra words <<< "$NETWORKS"; only=(--only "${words[@]}"); fi
  python3 benchmarks/counted_networks.py "${small[@]}" "${only[@]}" --out "$OUT" \
    > "$OUT/counted_networks.log" 2>&1
  second=$?
elif [ $mode = roofline ]; then
  # PYTHONHASHSEED: opt_einsum's random-greedy orders (tropical_einsum.py's networks) hang on it.
  PYTHONHASHSEED=0 python3 benchmarks/einsum_roofline.py --out "$OUT" \
    > "$OUT/einsum_roofline.log" 2>&1
  first=$?
  python3 benchmarks/einsum_roofline.py --published --out "$OUT" \
    --also benchmarks/results/tensor_network_published-roofline-paths.json \
    > "$OUT/einsum_roofline_published.log" 2>&1
  second=$?
elif [ $mode = tropical ]; then
  first=0 tuned=()
  if [ "${SWEEP:-0}" = 1 ]; then
    # The sweep stores its winners in the cache dir; the GEMM benchmark reads them (--autotune).
    python3 benchmarks/tile_sweep.py --kinds large small --out "$OUT" > "$OUT/tile_sweep.log" 2>&1
    first=$? tuned=(--autotune)
  fi
  python3 benchmarks/tropical_gemm.py "${tuned[@]}" --out "$OUT" > "$OUT/tropical_gemm.log" 2>&1
  second=$?
  python3 benchmarks/sustained.py > "$OUT/sustained.md" 2>&1
else
  python3 benchmarks/gpu_start.py --out "$OUT" > "$OUT/gpu_start.log" 2>&1
  first=$?
  python3 benchmarks/compile_service.py --machine "$gpu host, $(nproc) CPUs" --out "$OUT" \
    > "$OUT/compile_service.log" 2>&1
  second=$?
fi

echo "== summary =="
cat "$OUT/nvidia-smi.csv"
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -20
tail -1 "$OUT/pytest.log"
for log in "$OUT"/*.md; do cat "$log"; done
echo "exit: tests $tests, benchmarks $first $second ($mode)"
[ "$tests$first$second" = "000" ]
