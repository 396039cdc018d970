# shellcheck shell=bash
# Sourced by scripts/gpu_check.sh and the steps in scripts/gpu/: the whole check runs within one
# wall-clock budget. gpu_check.sh exports FP_DEADLINE (epoch seconds); `step_limit LIMIT RESERVE`
# prints the seconds a step may take: LIMIT, or less where the deadline minus RESERVE seconds
# (kept for the steps after it) comes first, but at least 10. Without FP_DEADLINE, LIMIT.
step_limit() {
  local limit=$1 reserve=${2:-0} left
  if [ -n "${FP_DEADLINE:-}" ]; then
    left=$((FP_DEADLINE - $(date +%s) - reserve))
    [ "$left" -lt "$limit" ] && limit=$left
    [ "$limit" -lt 10 ] && limit=10
  fi
  echo "$limit"
}
