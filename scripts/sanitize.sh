#!/usr/bin/env bash
# The CPU library and every test under AddressSanitizer and UndefinedBehaviorSanitizer (any
# report fails the run), in its own build folder without CUDA. Run after scripts/setup.sh (which
# installs the compilers, GoogleTest and the Python test packages into .venv).
# Usage: bash scripts/sanitize.sh [--build-only] [build-dir]   (--build-only: build, run nothing; a
# later run without it builds nothing more)
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
if [ "${1:-}" = --build-only ]; then build_only=1; shift; fi
BUILD_DIR=${1:-build-sanitize}

flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFP_ENABLE_CUDA=OFF \
  -DPython3_EXECUTABLE="$PWD/.venv/bin/python" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
[ "$build_only" = 0 ] || exit 0

export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The C++ tests and the CLI's tests; the Python tests load the library into an unsanitized
# interpreter, so they run below with the sanitizer runtimes preloaded.
ctest --test-dir "$BUILD_DIR" --output-on-failure -E "^(python_package|accuracy_units|installed_package)$"
preload="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libubsan.so)"
# Leaks are not checked in Python: the interpreter keeps its own allocations alive at exit. The
# torch and transformers tests (run by the main test command) are left out here: torch's own
# native code is not built for the sanitizer runtimes.
FLASHPREFILL_LIB="$PWD/$BUILD_DIR/libflashprefill.so" LD_PRELOAD="$preload" \
  ASAN_OPTIONS=abort_on_error=1:detect_leaks=0 .venv/bin/python -m pytest -q python/tests \
  accuracy/test_accuracy_units.py --ignore-glob="*test_torch*" --ignore-glob="*test_hf*"
echo "sanitize: clean"
