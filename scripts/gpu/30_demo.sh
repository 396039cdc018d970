#!/usr/bin/env bash
# The main job and the Python package on a GPU machine: `flashprefill demo` at 32K on CUDA (bf16,
# then FP8), then
# the torch/CUDA tests of the Python package (CUDA vs the CPU reference, paged, graph capture,
# the torch ops and Plan, the Hugging Face backend, and the vLLM and SGLang backends' translation
# of engine-held tensors, which import neither engine), then the host cost per call.
# Usage: bash scripts/gpu/30_demo.sh [build-dir]; logs go to $OUT (or /tmp) when set.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
BUILD_DIR=${1:-build}
LOG_DIR=${OUT:-/tmp}
# shellcheck source=scripts/lib/budget.sh
. scripts/lib/budget.sh
export LD_LIBRARY_PATH=$PWD/$BUILD_DIR:${LD_LIBRARY_PATH:-}
status=0
timeout "$(step_limit 120 40)" "$BUILD_DIR/flashprefill" demo --device cuda --seqlen 32768 2>&1 | tee "$LOG_DIR/demo.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
timeout "$(step_limit 120 40)" "$BUILD_DIR/flashprefill" demo --device cuda --dtype fp8 --seqlen 32768 2>&1 | tee "$LOG_DIR/demo_fp8.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
tests=()
for t in torch torch_ops torch_ops_fp8 plan hf vllm_batch sglang_layout fp8; do
  [ -f "python/tests/test_$t.py" ] && tests+=("python/tests/test_$t.py")
done
PYTHONPATH=python FLASHPREFILL_LIB=$BUILD_DIR/libflashprefill.so timeout "$(step_limit 240)" \
  python3 -m pytest -q -p no:logging "${tests[@]}" 2>&1 | tee "$LOG_DIR/pytest_torch.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
PYTHONUNBUFFERED=1 timeout "$(step_limit 90)" python3 bench/bench_host.py --device cuda \
  --seqlen 8192 --lib "$BUILD_DIR/libflashprefill.so" --results "${FP_RESULTS_DIR:-bench/results}" \
  2>&1 | tee "$LOG_DIR/host.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
