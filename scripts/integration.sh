#!/usr/bin/env bash
# `make integration`: the integration tests in their two lanes at once (tests/integration/conftest.py, --lane),
# each with hosts of its own, named by LLMOPS_TEST_HOST (default llmops-vllm-it) with the lane's name added.
# Each lane's output goes to .build/integration-LANE.log and is printed when both have ended; the exit status
# is the first failing lane's. Extra arguments go to both pytest runs.
set -uo pipefail
cd "$(dirname "$0")/.."
readonly BASE=${LLMOPS_TEST_HOST:-llmops-vllm-it}
readonly LANES=(fleet host)
mkdir -p .build
pids=()
for lane in "${LANES[@]}"; do
  LLMOPS_TEST_HOST=$BASE-$lane pytest tests/integration --lane "$lane" --durations=12 \
    --junitxml=".build/junit-integration-$lane.xml" "$@" > ".build/integration-$lane.log" 2>&1 &
  pids+=("$!")
done
status=0
for index in "${!LANES[@]}"; do
  wait "${pids[$index]}"
  code=$?
  ((status)) || status=$code
done
for lane in "${LANES[@]}"; do
  echo "==== integration, lane $lane (.build/integration-$lane.log)"
  cat ".build/integration-$lane.log"
done
exit "$status"
