#!/usr/bin/env bash
# The serving backends on a GPU machine: the vLLM backend's index stage per chunk of a long prompt
# with and without kept means, and its prefill on FLASH_ATTN's paged cache (blocks in order and
# shuffled) against contiguous K/V (bench/bench_vllm.py; no vLLM needed).
# Usage: bash scripts/gpu/50_serving.sh [build-dir]; logs go to $OUT (or /tmp) when set.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
BUILD_DIR=${1:-build}
LOG_DIR=${OUT:-/tmp}
# shellcheck source=scripts/lib/budget.sh
. scripts/lib/budget.sh
PYTHONPATH=python PYTHONUNBUFFERED=1 timeout "$(step_limit 180)" python3 bench/bench_vllm.py \
  --lib "$BUILD_DIR/libflashprefill.so" --results "${FP_RESULTS_DIR:-bench/results}" 2>&1 |
  tee "$LOG_DIR/serving_bench.log"
exit "${PIPESTATUS[0]}"
