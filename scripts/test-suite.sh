#!/usr/bin/env bash
# `make test`: each stage of the suite in order, stopping after the first that fails, then how long each stage took
# and the slowest tests (scripts/test-times.py), whether the suite passed or not.
# Usage: scripts/test-suite.sh STAGE...
# A stage is a make target (integration), or branches joined by `+` that run at once, each branch one target or
# several in order joined by `,` (lint,unit+molecule). A branch stops at its first failing target. Each target of
# such a stage writes its output to .build/TARGET.log, printed in order once every branch has ended; the targets'
# common prerequisites (the venv, the wheelhouse) are made before, so that no two branches make the same file.
set -uo pipefail
cd "$(dirname "$0")/.."
readonly TIMES=.build/test-times
mkdir -p .build
: > "$TIMES"
rm -f .build/junit-*.xml

# Run one branch: its targets in order, each one's output in .build/TARGET.log and `SECONDS STATUS` in
# .build/TARGET.status, until one fails.
run_branch() {
  local target start code
  for target in "$@"; do
    start=$(date +%s)
    make --no-print-directory "$target" > ".build/$target.log" 2>&1
    code=$?
    echo "$(($(date +%s) - start)) $code" > ".build/$target.status"
    ((code == 0)) || return "$code"
  done
}

# Run the branches of one stage at once; the exit status is the first failing branch's.
run_branches() {
  local branches=("$@") pids=() status=0 branch index code target seconds
  local -a targets
  make --no-print-directory venv wheelhouse || return
  for branch in "${branches[@]}"; do
    IFS=, read -r -a targets <<< "$branch"
    run_branch "${targets[@]}" &
    pids+=("$!")
  done
  for index in "${!branches[@]}"; do
    wait "${pids[$index]}"
    code=$?
    ((status)) || status=$code
  done
  for branch in "${branches[@]}"; do
    IFS=, read -r -a targets <<< "$branch"
    for target in "${targets[@]}"; do
      [[ -e .build/$target.status ]] || continue
      read -r seconds code < ".build/$target.status"
      echo "==== $target: $( ((code)) && echo "failed, rc $code" || echo passed) in $seconds s (.build/$target.log)"
      cat ".build/$target.log"
      rm ".build/$target.status"
    done
  done
  return "$status"
}

status=0
for stage in "$@"; do
  start=$(date +%s)
  if [[ $stage == *[+,]* ]]; then
    IFS=+ read -r -a branches <<< "$stage"
    run_branches "${branches[@]}" || status=$?
  else
    make --no-print-directory "$stage" || status=$?
  fi
  echo "$stage $(($(date +%s) - start))" >> "$TIMES"
  ((status == 0)) || break
done
python3 scripts/test-times.py "$TIMES" .build/junit-*.xml
exit "$status"
