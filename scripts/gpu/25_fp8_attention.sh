#!/usr/bin/env bash
# The e4m3 attention on a GPU machine: builds fp_gpu_fp8_check if the build folder lacks it, runs
# it (fp_dense_attention and fp_sparse_attention in e4m3 against the CPU FP8 reference and float32
# attention, D = 64 and 128, a CUDA graph of the dense call, then the 32K timing beside bf16
# dense), and compute-sanitizer on its small cases, then bench/bench_fp8.py (e4m3 dense, sparse
# and the whole prefill beside our bf16 path and SDPA cuDNN / FLASH; its results file into
# $FP_RESULTS_DIR, default bench/results).
# Usage: bash scripts/gpu/25_fp8_attention.sh [build-dir]; logs go to $OUT (or /tmp).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=scripts/lib/check.sh
. scripts/lib/check.sh
BUILD_DIR=${1:-build}
LOG_DIR=${OUT:-/tmp}
CHECK_LIMIT=${CHECK_LIMIT:-180}
SANITIZER_LIMIT=${SANITIZER_LIMIT:-150}
SANITIZER_RESERVE=120
SANITIZER_TOOLS=${SANITIZER_TOOLS:-memcheck racecheck synccheck initcheck}
RESULTS_DIR=${FP_RESULTS_DIR:-bench/results}
BENCH_LIMIT=${BENCH_LIMIT:-200}

if [ ! -x "$BUILD_DIR/fp_gpu_fp8_check" ]; then
  echo "25_fp8_attention: building in $BUILD_DIR"
  # CMake 3.25 knows neither the CUDA20 dialect for nvcc nor an empty architecture list.
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP_ENABLE_CUDA=ON \
    -DFP_BUILD_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES=OFF \
    -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
    -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 >/dev/null || exit 1
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target fp_gpu_fp8_check || exit 1
fi

status=0
run_check fp8_attention 150 "the sanitizer and the benchmark" "$BUILD_DIR/fp_gpu_fp8_check" 1 small ||
  status=1
PYTHONUNBUFFERED=1 timeout "$(step_limit "$BENCH_LIMIT" 30)" python3 bench/bench_fp8.py \
  --lib "$BUILD_DIR/libflashprefill.so" --results "$RESULTS_DIR" 2>&1 | tee "$LOG_DIR/fp8_bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== fp8 attention check =="
grep -E "FAIL|PASS|TFLOP/s|speedup" "$LOG_DIR/fp8_attention_check.log" | tail -n 60
cat "$LOG_DIR/fp8_attention_sanitizer.log"
echo "== fp8 bench =="
grep "^row=" "$LOG_DIR/fp8_bench.log"
exit $status
