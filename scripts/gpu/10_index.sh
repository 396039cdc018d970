#!/usr/bin/env bash
# Index stage on a GPU machine: builds libflashprefill and fp_gpu_index_check if the build folder
# lacks them, runs the check (CPU reference vs CUDA, graph capture, incremental pooling, errors),
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on its small cases, and the
# benchmark against torch SDPA (its results file into $FP_RESULTS_DIR, default bench/results), and
# prints the short tables last.
# Usage: bash scripts/gpu/10_index.sh [build-dir]; logs go to $OUT (or /tmp) when set.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=scripts/lib/check.sh
. scripts/lib/check.sh
BUILD_DIR=${1:-build}
LOG_DIR=${OUT:-/tmp}
RESULTS_DIR=${FP_RESULTS_DIR:-bench/results}
# Every step runs under a time limit (seconds), so a hang cannot eat the whole check; within
# gpu_check.sh's budget the limits are cut to keep time for the steps after them.
CHECK_LIMIT=${CHECK_LIMIT:-300}
SANITIZER_LIMIT=${SANITIZER_LIMIT:-150}
SANITIZER_RESERVE=400
BENCH_LIMIT=${BENCH_LIMIT:-300}
SANITIZER_TOOLS=${SANITIZER_TOOLS:-memcheck racecheck synccheck initcheck}

if [ ! -x "$BUILD_DIR/fp_gpu_index_check" ] || [ ! -f "$BUILD_DIR/libflashprefill.so" ]; then
  echo "10_index: building in $BUILD_DIR"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP_ENABLE_CUDA=ON \
    -DFP_BUILD_TESTS=OFF >/dev/null || exit 1
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target flashprefill fp_gpu_index_check || exit 1
fi

run_check index 420 "the sanitizer and the benchmark" "$BUILD_DIR/fp_gpu_index_check" small
check=$?
PYTHONUNBUFFERED=1 timeout "$(step_limit "$BENCH_LIMIT" 360)" python3 bench/bench_index.py \
  --lib "$BUILD_DIR/libflashprefill.so" --json "$LOG_DIR/index_bench.json" \
  --results "$RESULTS_DIR" 2>&1 |
  tee "$LOG_DIR/index_bench.log"
bench=${PIPESTATUS[0]}

echo "== index check =="
grep -E "FAIL|PASS" "$LOG_DIR/index_check.log" | tail -n 30
cat "$LOG_DIR/index_sanitizer.log"
echo "== index bench =="
tail -n 7 "$LOG_DIR/index_bench.log"
[ "$check" -eq 0 ] && [ "$bench" -eq 0 ]
