#!/usr/bin/env bash
# The GPU check: builds what is missing, then runs every step in scripts/gpu/ in order (index
# stage, attention operator, demo and Python package: each checks against the CPU reference, runs
# compute-sanitizer on small cases, times against torch baselines and prints its short table
# last), and, with FP_BASELINE_LIB, compares this build with a previous one in one process.
#
#   bash scripts/gpu_check.sh [filter]          e.g. `bash scripts/gpu_check.sh index`
#
# Environment:
#   FP_RESULTS_DIR   where the benchmarks write their results files (default bench/results);
#                    bench/report.py renders docs/PERF.md from them
#   FP_TIME_BUDGET   seconds for the whole check, a build included (default 540): every step's
#                    time limit is cut so that the check ends within it; the benchmarks write their
#                    results row by row, so a cut benchmark keeps the rows it measured (build
#                    first, `cmake --build build`, to leave the budget to the checks and timings)
#   FP_BASELINE_LIB  a previous build's libflashprefill.so: tools/compare_builds.py times it
#                    against build/libflashprefill.so, interleaved on the same inputs
#   FP_COMMIT        the commit to record where the tree has no git metadata
#   FP_CUTLASS_INCLUDE  the CUTLASS/CuTe headers' folder for the build, where the machine's Python
#                    has no nvidia-cutlass package (packaging/cutlass_headers.py finds it otherwise)
#   OUT              where the logs go (default out/)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-out}
mkdir -p "$OUT"
export FP_RESULTS_DIR=${FP_RESULTS_DIR:-bench/results}
filter=${1:-}
export FP_DEADLINE=$(($(date +%s) + ${FP_TIME_BUDGET:-540}))
[ -n "${FP_BASELINE_LIB:-}" ] && export FP_DEADLINE=$((FP_DEADLINE - 120))  # kept for the comparison
if [ ! -x build/flashprefill ] || [ ! -f build/libflashprefill.so ]; then
  echo "gpu_check: configuring and building on this machine"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP_ENABLE_CUDA=ON -DFP_BUILD_TESTS=OFF \
    ${FP_CUTLASS_INCLUDE:+-DFP_CUTLASS_INCLUDE="$FP_CUTLASS_INCLUDE"} >/dev/null \
    && cmake --build build -j "$(nproc)" 2>&1 | tail -5 || exit 1
fi
status=0
summary=()
touch "$OUT/.started"
for step in scripts/gpu/*.sh; do
  case "$step" in *"$filter"*) ;; *) continue ;; esac
  name=$(basename "$step" .sh)
  echo "=== $name"
  bash "$step" 2>&1 | tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  summary+=("$(printf '%-16s %s' "$name" "$([ "$rc" -eq 0 ] && echo passed || echo "FAILED (exit $rc)")")")
  [ "$rc" -eq 0 ] || { echo "=== $name FAILED (exit $rc)"; status=1; }
done
if [ -n "${FP_BASELINE_LIB:-}" ]; then
  echo "=== compare builds: baseline $FP_BASELINE_LIB against build/libflashprefill.so"
  PYTHONUNBUFFERED=1 timeout 120 python3 tools/compare_builds.py \
    "baseline=$FP_BASELINE_LIB,current=build/libflashprefill.so" dense,sparse --rounds 3 \
    --results "$FP_RESULTS_DIR" 2>&1 | tee "$OUT/compare_builds.log"
  rc=${PIPESTATUS[0]}
  summary+=("$(printf '%-16s %s' compare_builds "$([ "$rc" -eq 0 ] && echo passed || echo "FAILED (exit $rc)")")")
  [ "$rc" -eq 0 ] || { echo "=== compare builds FAILED"; status=1; }
fi
echo "=== summary"
printf '%s\n' "${summary[@]}"
if [ -f "$OUT/attention_bench.json" ] && [ "$OUT/attention_bench.json" -nt "$OUT/.started" ]; then
  python3 bench/goals.py "$OUT/attention_bench.json" | tail -n 1
fi
echo "results files written:"
find "$FP_RESULTS_DIR" -name '*.json' -newer "$OUT/.started" | sort
exit $status
