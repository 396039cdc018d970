#!/usr/bin/env bash
# The long prefill on a GPU machine: bench/bench_long.py (fp_prefill in query-tile ranges: at 64K
# the ranged calls against the one-range call and the staged index, bit for bit; at 1M tokens the
# time, the workspace, the peak of device memory and the rows of three query slices against dense
# attention on those rows), its results file into $FP_RESULTS_DIR (default bench/results).
# Usage: bash scripts/gpu/40_long.sh [build-dir]; logs go to $OUT (or /tmp) when set.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
BUILD_DIR=${1:-build}
LOG_DIR=${OUT:-/tmp}
# shellcheck source=scripts/lib/budget.sh
. scripts/lib/budget.sh
PYTHONUNBUFFERED=1 timeout "$(step_limit 240)" python3 bench/bench_long.py \
  --lib "$BUILD_DIR/libflashprefill.so" --results "${FP_RESULTS_DIR:-bench/results}" \
  2>&1 | tee "$LOG_DIR/long.log"
exit "${PIPESTATUS[0]}"
