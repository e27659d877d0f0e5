#!/usr/bin/env bash
# On the H200 machine, from the root of the checkout: the GPU host made of the files carried into CARRY (the
# wheelhouse and the model's config once, systemd and Ansible when they are not up yet), then the runner's STEPS,
# its results in $OUT. README.md here gives the GPU commands around it.
#
# usage: bash benchmarks/gpu_host/h200.sh CARRY STEPS        e.g. /tmp/gpucarry weights,deploy,bench,stop,kill,share
set -euo pipefail

readonly CARRY=${1:?the directory of the carried files} STEPS=${2:?the runner steps}
readonly PYTHON=/opt/torch/.venv/bin/python3
readonly WHEELHOUSE=/opt/llmops/wheelhouse
readonly MODEL_CONFIG=/var/lib/llmops-gpu-host/models/llama-1b-config
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

if ! compgen -G "$WHEELHOUSE/vllm-*-requirements.txt" >/dev/null; then
  bash scripts/gpu-host/host.sh wheelhouse --chunks "$CARRY" --python "$PYTHON" --out "$WHEELHOUSE" --model "$MODEL_CONFIG"
fi
bash scripts/gpu-host/host.sh up --carry "$CARRY" --python "$PYTHON"
PYTHONUNBUFFERED=1 "$PYTHON" benchmarks/gpu_host/run.py --inventory inventories/gpu-host \
  --catalog benchmarks/gpu_host/catalog/h200 --out "${OUT:?}" --python "$PYTHON" --weights-from "$MODEL_CONFIG" \
  --steps "$STEPS"
