#!/usr/bin/env bash
# `make test`: each part of the suite in order, stopping at the first that fails, then how long each part took
# and the slowest tests (scripts/test-times.py), whether the suite passed or not.
# Usage: scripts/test-suite.sh PART...   (make targets, such as lint sanity unit molecule integration)
set -uo pipefail
cd "$(dirname "$0")/.."
readonly TIMES=.build/test-times
mkdir -p .build
: > "$TIMES"
rm -f .build/junit-*.xml
status=0
for part in "$@"; do
  start=$(date +%s)
  make --no-print-directory "$part" || status=$?
  echo "$part $(($(date +%s) - start))" >> "$TIMES"
  ((status == 0)) || break
done
python3 scripts/test-times.py "$TIMES" .build/junit-*.xml
exit "$status"
