# shellcheck shell=bash
# Sourced by the GPU steps in scripts/gpu/. run_sanitizers PREFIX CMD...: runs CMD under each
# compute-sanitizer tool in $SANITIZER_TOOLS, each within $SANITIZER_LIMIT seconds (less near the
# check's deadline, keeping $SANITIZER_RESERVE seconds: scripts/lib/budget.sh), with its log
# in $LOG_DIR/PREFIX_TOOL.log and one summary line per tool on stdout and in
# $LOG_DIR/PREFIX_sanitizer.log. Returns 1 if any tool reported an error or did not finish.
run_sanitizers() {
  local prefix=$1 tool rc failed=0
  shift
  : >"$LOG_DIR/${prefix}_sanitizer.log"
  for tool in $SANITIZER_TOOLS; do
    timeout "$(step_limit "$SANITIZER_LIMIT" "${SANITIZER_RESERVE:-0}")" compute-sanitizer --tool "$tool" --error-exitcode 3 "$@" \
      >"$LOG_DIR/${prefix}_$tool.log" 2>&1
    rc=$?
    echo "compute-sanitizer $tool: exit $rc ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
      "$LOG_DIR/${prefix}_$tool.log" | tail -n 1))" | tee -a "$LOG_DIR/${prefix}_sanitizer.log"
    [ $rc -eq 0 ] || failed=1
  done
  return $failed
}
