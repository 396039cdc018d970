#!/usr/bin/env bash
# Attention operator on a GPU machine: builds libflashprefill and fp_gpu_attention_check if the
# build folder lacks them, runs the check (CPU reference and float32 attention vs CUDA),
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on a small case, then the
# benchmark against torch SDPA (cuDNN, FLASH) and FlexAttention (its results file into
# $FP_RESULTS_DIR, default bench/results), and prints the short tables last, ending with the
# goals (bench/goals.py).
# Usage: bash scripts/gpu/20_attention.sh [build-dir] [check|bench|all]; logs go to $OUT (or /tmp).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=scripts/lib/check.sh
. scripts/lib/check.sh
BUILD_DIR=${1:-build}
WHAT=${2:-all}
LOG_DIR=${OUT:-/tmp}
RESULTS_DIR=${FP_RESULTS_DIR:-bench/results}
# A hung kernel must not eat the whole check: every step runs under a time limit (seconds), cut
# within gpu_check.sh's budget to keep time for the steps after it.
CHECK_LIMIT=${CHECK_LIMIT:-300}
SANITIZER_LIMIT=${SANITIZER_LIMIT:-150}
SANITIZER_RESERVE=300
BENCH_LIMIT=${BENCH_LIMIT:-420}
BENCH_ARGS=${BENCH_ARGS:-}
SANITIZER_TOOLS=${SANITIZER_TOOLS:-memcheck racecheck synccheck initcheck}

if [ ! -x "$BUILD_DIR/fp_gpu_attention_check" ] || [ ! -f "$BUILD_DIR/libflashprefill.so" ]; then
  echo "20_attention: building in $BUILD_DIR"
  # CMake 3.25 knows neither the CUDA20 dialect for nvcc nor an empty architecture list.
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP_ENABLE_CUDA=ON \
    -DFP_BUILD_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES=OFF \
    -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
    -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 >/dev/null || exit 1
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target flashprefill fp_gpu_attention_check || exit 1
fi

status=0
if [ "$WHAT" != bench ]; then
  run_check attention 330 "the sanitizer and the benchmark" "$BUILD_DIR/fp_gpu_attention_check" \
    1 small || status=1
fi
if [ "$WHAT" != check ]; then
  # shellcheck disable=SC2086 # BENCH_ARGS is a list of options
  PYTHONUNBUFFERED=1 timeout "$(step_limit "$BENCH_LIMIT" 60)" python3 bench/bench_attention.py \
    --lib "$BUILD_DIR/libflashprefill.so" --json "$LOG_DIR/attention_bench.json" \
    --results "$RESULTS_DIR" $BENCH_ARGS 2>&1 |
    tee "$LOG_DIR/attention_bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

echo "== attention check =="
[ -f "$LOG_DIR/attention_check.log" ] && grep -E "FAIL|PASS" "$LOG_DIR/attention_check.log" | tail -n 20
[ -f "$LOG_DIR/attention_sanitizer.log" ] && cat "$LOG_DIR/attention_sanitizer.log"
echo "== attention bench =="
[ -f "$LOG_DIR/attention_bench.log" ] && grep "^row=" "$LOG_DIR/attention_bench.log"
if [ "$WHAT" != check ] && [ -f "$LOG_DIR/attention_bench.json" ]; then
  echo "== attention goals =="
  python3 bench/goals.py "$LOG_DIR/attention_bench.json"
fi
exit $status
