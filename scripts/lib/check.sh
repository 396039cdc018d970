# shellcheck shell=bash
# Sourced by the GPU steps in scripts/gpu/ (it sources budget.sh and sanitize.sh beside it).
# run_check PREFIX RESERVE SKIPPED CHECK [ARG...]: runs CHECK within $CHECK_LIMIT seconds (less
# near the check's deadline, keeping RESERVE seconds for what follows: budget.sh), its output on
# stdout and in $LOG_DIR/PREFIX_check.log. When CHECK times out, says so, naming SKIPPED (what the
# step leaves out), and ends the step with exit 1; otherwise runs compute-sanitizer on CHECK ARG...
# (run_sanitizers PREFIX, sanitize.sh). Returns 1 if CHECK or a sanitizer tool failed, else 0.
# shellcheck source=scripts/lib/budget.sh
. "$(dirname "${BASH_SOURCE[0]}")/budget.sh"
# shellcheck source=scripts/lib/sanitize.sh
. "$(dirname "${BASH_SOURCE[0]}")/sanitize.sh"

run_check() {
  local prefix=$1 reserve=$2 skipped=$3 check=$4 rc limit
  shift 3
  limit=$(step_limit "$CHECK_LIMIT" "$reserve")
  timeout "$limit" "$check" 2>&1 | tee "$LOG_DIR/${prefix}_check.log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 124 ]; then
    if [ "$limit" -lt "$CHECK_LIMIT" ]; then
      echo "$(basename "$0" .sh): the check ran past the ${limit} s that FP_TIME_BUDGET left it (its own limit: ${CHECK_LIMIT} s); skipping $skipped"
    else
      echo "$(basename "$0" .sh): the check ran past its ${limit} s limit (a hang?); skipping $skipped"
    fi
    exit 1
  fi
  run_sanitizers "$prefix" "$@" || rc=1
  [ "$rc" -eq 0 ]
}
