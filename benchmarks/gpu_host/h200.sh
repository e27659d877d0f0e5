#!/usr/bin/env bash
# On the H200 machine, from the root of the checkout, in two GPU commands (README.md here): `up` makes the GPU
# host of the files carried so far (systemd booted, Ansible installed, ensurepip where the Python has none); STEPS
# adds the wheelhouse and the model's config once the bundle's chunks are all there, then runs the runner's STEPS,
# its results in $OUT.
#
# usage: bash benchmarks/gpu_host/h200.sh CARRY up
#        bash benchmarks/gpu_host/h200.sh CARRY STEPS [RUNNER OPTIONS]    e.g. /tmp/gpucarry rollout --gate-rounds 30
set -euo pipefail

readonly CARRY=${1:?the directory of the carried files} STEPS=${2:?up, or the runner steps}
readonly PYTHON=/opt/torch/.venv/bin/python3
readonly WHEELHOUSE=/opt/llmops/wheelhouse
readonly MODEL_CONFIG=/var/lib/llmops-gpu-host/models/llama-1b-config
# MiniMax-M2.5's own config.json, which the start_seed step cuts to 16 layers (make_seed_model.py).
readonly SEED_CONFIG=tests/unit/fixtures/configs/MiniMax-M2.5.config.json
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

bash scripts/gpu-host/host.sh up --carry "$CARRY" --python "$PYTHON"
[[ $STEPS == up ]] && exit 0
if ! compgen -G "$WHEELHOUSE/vllm-*-requirements.txt" >/dev/null; then
  bash scripts/gpu-host/host.sh wheelhouse --chunks "$CARRY" --python "$PYTHON" --out "$WHEELHOUSE" --model "$MODEL_CONFIG"
fi
exec env PYTHONUNBUFFERED=1 "$PYTHON" benchmarks/gpu_host/run.py --inventory inventories/gpu-host \
  --catalog benchmarks/gpu_host/catalog/h200 --out "${OUT:?}" --python "$PYTHON" --weights-from "$MODEL_CONFIG" \
  --seed-from "$SEED_CONFIG" --steps "$STEPS" "${@:3}"
