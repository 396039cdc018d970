#!/usr/bin/env bash
# The one device call: builds what is missing, then runs every GPU check and benchmark in
# scripts/gpu/ in order (each prints its own short table last). Usage on the device:
#   bash scripts/gpu_check.sh [filter]      e.g. `bash scripts/gpu_check.sh index`
# Logs go to $OUT (when set) so that they come back with the call.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
filter=${1:-}
if [ ! -x build/flashprefill ] || [ ! -f build/libflashprefill.so ]; then
  echo "gpu_check: configuring and building on this machine"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP_ENABLE_CUDA=ON -DFP_BUILD_TESTS=OFF >/dev/null \
    && cmake --build build -j "$(nproc)" 2>&1 | tail -5 || exit 1
fi
status=0
for step in scripts/gpu/*.sh; do
  case "$step" in *"$filter"*) ;; *) continue ;; esac
  name=$(basename "$step" .sh)
  echo "=== $name"
  bash "$step" 2>&1 | tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { echo "=== $name FAILED (exit $rc)"; status=1; }
done
exit $status
