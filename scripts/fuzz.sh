#!/usr/bin/env bash
# Builds fuzz/fuzz_abi.cpp, the libFuzzer target over the C ABI, with the CPU library under clang,
# AddressSanitizer and UndefinedBehaviorSanitizer, and runs it from the committed seed corpus
# (fuzz/corpus, left unchanged) for a bounded time. Any sanitizer report, crash, timeout or failed
# check fails the run; the input that caused it is kept as BUILD_DIR/crash-* (or leak-*, timeout-*).
# Installs clang-14 and its runtime from Debian when they are missing.
# Usage: bash scripts/fuzz.sh [--build-only] [seconds, default 150] [build-dir, default build-fuzz]
# (--build-only: build, run nothing; a later run without it builds nothing more)
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
if [ "${1:-}" = --build-only ]; then build_only=1; shift; fi
LIMIT=${1:-150}
BUILD_DIR=${2:-build-fuzz}
CXX=clang++-14

probe='extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }'
if ! echo "$probe" | "$CXX" -x c++ -fsanitize=fuzzer,address,undefined - -o /dev/null 2>/dev/null; then
  echo "fuzz: installing clang-14 and libclang-rt-14-dev"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-14 libclang-rt-14-dev
fi
command -v cmake >/dev/null && command -v ninja >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake ninja-build; }

sanitizers="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$CXX" \
  -DFP_ENABLE_CUDA=OFF -DFP_BUILD_TESTS=OFF -DFP_BUILD_FUZZER=ON \
  -DCMAKE_CXX_FLAGS="$sanitizers -fsanitize=fuzzer-no-link -fno-omit-frame-pointer" \
  -DCMAKE_EXE_LINKER_FLAGS="$sanitizers" -DCMAKE_SHARED_LINKER_FLAGS="$sanitizers" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target fuzz_abi
[ "$build_only" = 0 ] || exit 0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
"$BUILD_DIR/fuzz_abi" -max_total_time="$LIMIT" -timeout=60 -rss_limit_mb=4096 -max_len=256 \
  -print_final_stats=1 -artifact_prefix="$BUILD_DIR/" "$work" fuzz/corpus
echo "fuzz: clean after ${LIMIT} s"
