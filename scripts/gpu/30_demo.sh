#!/usr/bin/env bash
# The main job and the Python package on a GPU machine: `flashprefill demo` at 32K on CUDA, then
# the torch/CUDA tests of the Python package (CUDA vs the CPU reference, paged, graph capture).
# Usage: bash scripts/gpu/30_demo.sh [build-dir]; logs go to $OUT (or /tmp) when set.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${1:-build}
LOG_DIR=${OUT:-/tmp}
# shellcheck source=scripts/lib/budget.sh
. scripts/lib/budget.sh
export LD_LIBRARY_PATH=$PWD/$BUILD_DIR:${LD_LIBRARY_PATH:-}
status=0
timeout "$(step_limit 120 40)" "$BUILD_DIR/flashprefill" demo --device cuda --seqlen 32768 2>&1 | tee "$LOG_DIR/demo.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
PYTHONPATH=python FLASHPREFILL_LIB=$BUILD_DIR/libflashprefill.so timeout "$(step_limit 120)" \
  python3 -m pytest -q python/tests/test_torch.py 2>&1 | tee "$LOG_DIR/pytest_torch.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
