#!/usr/bin/env bash
# The shared library's dynamic symbol table holds its C ABI (fp_*) and nothing else, so two copies
# of the library in one process (two packages, two versions) never bind to each other's internals.
# Usage: tests/check_exports.sh path/to/libflashprefill.so
set -euo pipefail
lib="$1"
symbols=$(nm -D --defined-only "$lib" | awk '{print $NF}')
abi=$(grep -c '^fp_' <<<"$symbols" || true)
others=$(grep -v '^fp_' <<<"$symbols" || true)
if [ -n "$others" ]; then
  echo "FAIL: $lib exports symbols outside the C ABI:"
  echo "$others" | head -20
  exit 1
fi
[ "$abi" -gt 0 ] || { echo "FAIL: $lib exports no fp_* symbol"; exit 1; }
echo "ok: $lib exports $abi fp_* symbols and nothing else"
