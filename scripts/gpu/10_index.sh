#!/usr/bin/env bash
# Index stage on a GPU machine: builds libflashprefill and fp_gpu_index_check if the build folder
# lacks them, runs the check (CPU reference vs CUDA, graph capture, incremental pooling, errors)
# and the benchmark against torch SDPA, and prints the short tables last.
# Usage: bash scripts/gpu/10_index.sh [build-dir]; logs go to $OUT (or /tmp) when set.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${1:-build}
LOG_DIR=${OUT:-/tmp}

if [ ! -x "$BUILD_DIR/fp_gpu_index_check" ] || [ ! -f "$BUILD_DIR/libflashprefill.so" ]; then
  echo "10_index: building in $BUILD_DIR"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP_ENABLE_CUDA=ON \
    -DFP_BUILD_TESTS=OFF >/dev/null || exit 1
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target flashprefill fp_gpu_index_check || exit 1
fi

"$BUILD_DIR/fp_gpu_index_check" 2>&1 | tee "$LOG_DIR/index_check.log"
check=$?
PYTHONUNBUFFERED=1 python3 bench/bench_index.py --lib "$BUILD_DIR/libflashprefill.so" \
  --json "$LOG_DIR/index_bench.json" 2>&1 | tee "$LOG_DIR/index_bench.log"
bench=$?

echo "== index check =="
grep -E "FAIL|PASS" "$LOG_DIR/index_check.log" | tail -n 30
echo "== index bench =="
tail -n 7 "$LOG_DIR/index_bench.log"
[ $check -eq 0 ] && [ $bench -eq 0 ]
