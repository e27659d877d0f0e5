#!/usr/bin/env bash
# ansible-test sanity on a copy of this checkout, laid out where ansible-test needs it:
# .build/sanity/ansible_collections/llmops/vllm (a real directory, not a link).
#
# ansible-test bootstraps pip in each of its venvs with a get-pip script that it downloads from a host
# that is not reachable here; the stand-in beside this script (ansible-test-get-pip.py) is put in its
# cache instead, unless a real one is already there.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly ROOT
readonly COPY=$ROOT/.build/sanity/ansible_collections/llmops/vllm
readonly PYTHON_VERSION=${SANITY_PYTHON:-3.11}

pip_version=$(python3 - <<'PY'
from ansible_test._internal.python_requirements import get_venv_packages
from ansible_test._internal.host_configs import NativePythonConfig
print(get_venv_packages(NativePythonConfig(version="3.11"))["pip"])
PY
)
get_pip=$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py
if [[ ! -f $get_pip ]]; then
  mkdir -p "$(dirname "$get_pip")"
  install -m 0644 "$ROOT/scripts/ansible-test-get-pip.py" "$get_pip"
fi

rm -rf "$COPY"
mkdir -p "$COPY"
# Tracked and new files, as git sees them; files deleted in the work tree are skipped.
git -C "$ROOT" ls-files -z --cached --others --exclude-standard |
  tar -C "$ROOT" --null --files-from=- --ignore-failed-read -cf - 2>/dev/null |
  tar -C "$COPY" -xf -
# ansible-test lists a collection's files through git when it is a repository.
git -C "$COPY" init -q
git -C "$COPY" add -A

cd "$COPY"
exec ansible-test sanity --python "$PYTHON_VERSION" --requirements "$@"
