#!/usr/bin/env bash
# Everything the GPU host needs that its machine lacks, built on this CPU machine into one git-ignored directory
# (default .gpucarry in the checkout's root), for GPU commands to carry in chunks of at most 45 MiB:
#
#   core_00 core_01 ...    the offline CUDA vLLM bundle of ../shared/gpu (build-vllm-bundle.sh: vLLM 0.26.0, the 34
#   SHA256SUMS unpack.sh   wheels it needs beside the machine's torch, the random 1.1B Llama's config and tokenizer),
#   make_model.py ...      built under the shared heavy lock (about 5 minutes of both cores) unless its chunks are
#                          there and match SHA256SUMS (--force builds it again)
#   systemd/*.deb          Debian 12's systemd 252 and the libraries the GPU machine's image lacks (apt-get download)
#   ansible-cp312/*.whl    ansible-core (the pin of requirements.txt), resolvelib and pip, for the GPU machine's
#                          Python 3.12, whose torch venv has the other packages the controller needs
#   ansible-cp311/*.whl    ansible-core, its dependencies, matplotlib's and pip, for Debian 12's Python 3.11 in the
#                          rehearsal (rehearse.sh)
#   uv/uv-*.whl            uv at the install role's pin, for the GPU host's wheelhouse (host.sh wheelhouse)
#
# Usage: scripts/gpu-host/carry.sh [--force] [OUTDIR]
# Environment: GPU_BUNDLE_SCRIPTS  the directory of build-vllm-bundle.sh (default: ../shared/gpu beside the main
#                                  worktree of this checkout)
#              LLMOPS_HEAVY_LOCK   the lock that heavy jobs share on this machine (default /tmp/llmops-heavy.lock)
set -euo pipefail

CHECKOUT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
readonly CHECKOUT
readonly LOCK=${LLMOPS_HEAVY_LOCK:-/tmp/llmops-heavy.lock}
# Debian 12's systemd and what the GPU machine's image (Ubuntu 24.04, no systemd) lacks of its libraries; the
# image's newer libsystemd0 and the like stay (host.sh copies only missing sonames).
readonly SYSTEMD_PACKAGES=(systemd libsystemd-shared libsystemd0 libacl1 libapparmor1 libaudit1 libcap2
  libcryptsetup12 libfdisk1 libip4tc2 libkmod2 libp11-kit0 libseccomp2 libdevmapper1.02.1 libjson-c5 libargon2-1)
# pip does not widen a manylinux_2_X platform to older ones: every glibc level up to Ubuntu 24.04's is listed.
MANYLINUX=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for minor in $(seq 5 39); do MANYLINUX+=(--platform "manylinux_2_${minor}_x86_64"); done
readonly MANYLINUX

log() { echo "carry: $*" >&2; }
die() {
  echo "carry: error: $*" >&2
  exit 1
}

bundle_intact() {
  local out=$1
  [[ -f $out/SHA256SUMS && -f $out/unpack.sh ]] || return 1
  (cd "$out" && grep -E ' core_[0-9]+$' SHA256SUMS | sha256sum -c --quiet - >/dev/null 2>&1)
}

build_bundle() {
  local out=$1 force=$2 scripts
  if [[ $force == 0 ]] && bundle_intact "$out"; then
    log "vLLM bundle present in $out (its core chunks match SHA256SUMS)"
    return
  fi
  scripts=${GPU_BUNDLE_SCRIPTS:-$(dirname "$(git -C "$CHECKOUT" worktree list --porcelain | sed -n '1s/^worktree //p')")/shared/gpu}
  [[ -x $scripts/build-vllm-bundle.sh ]] || die "no build-vllm-bundle.sh in $scripts; set GPU_BUNDLE_SCRIPTS"
  log "building the vLLM bundle into $out under $LOCK (about 5 minutes of both cores)"
  flock -o "$LOCK" bash "$scripts/build-vllm-bundle.sh" "$out"
}

download_systemd() {
  local out=$1/systemd
  rm -rf "$out"
  mkdir -p "$out"
  # _apt cannot write into root's directories; the download runs as root, which apt warns about and allows.
  (cd "$out" && apt-get download -qq "${SYSTEMD_PACKAGES[@]}" 2>&1 | { grep -v '^W: Download is performed unsandboxed' || true; } >&2)
  log "systemd: $(find "$out" -name '*.deb' | wc -l) packages, $(du -sh "$out" | cut -f1)"
}

# The wheels of the controller's venv (host.sh installs every one of them, without resolving). For Python 3.12, the
# H200 machine's: ansible-core and resolvelib alone, for the venv finds jinja2, PyYAML, MarkupSafe, packaging and
# matplotlib in the machine's torch venv, and cryptography, which only Ansible Vault needs, stays behind (a command
# carries at most 64 MiB). For 3.11, Debian's python3 in the rehearsal: the whole closure, matplotlib's included.
download_ansible() {
  local out=$1 version=$2 keep=$3 requirements=("${@:4}") directory closure
  directory=$out/ansible-cp${version/./}
  closure=$(mktemp -d)
  python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: --implementation cp \
    --python-version "$version" --abi "cp${version/./}" --abi abi3 --abi none "${MANYLINUX[@]}" \
    -d "$closure" pip "${requirements[@]}" 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; } >&2
  [[ -n $(compgen -G "$closure/ansible_core-*.whl") ]] || die "pip download of ansible-core for Python $version failed"
  rm -rf "$directory"
  mkdir -p "$directory"
  find "$closure" -name '*.whl' | grep -E "/($keep)-[^/]*\.whl\$" | xargs -r mv -t "$directory"
  rm -rf "$closure"
  log "ansible for Python $version: $(find "$directory" -name '*.whl' | wc -l) wheels, $(du -sh "$directory" | cut -f1)"
}

# uv, which vllm_install installs with (its pin, vllm_install_uv_version), for the H200's wheelhouse.
download_uv() {
  local out=$1/uv version
  version=$(sed -n 's/^vllm_install_uv_version: *"\(.*\)"/\1/p' "$CHECKOUT/roles/vllm_install/defaults/main.yml")
  [[ -n $version ]] || die "no vllm_install_uv_version in roles/vllm_install/defaults/main.yml"
  rm -rf "$out"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --implementation cp \
    --python-version 3.12 "${MANYLINUX[@]}" -d "$out" "uv==$version" 2>&1 |
    { grep -v 'is ignored: it is neither a file nor a directory' || true; } >&2
  log "uv $version: $(du -sh "$out" | cut -f1)"
}

main() {
  local force=0 out ansible matplotlib exclude
  if [[ ${1-} == --force ]]; then
    force=1
    shift
  fi
  out=${1:-$CHECKOUT/.gpucarry}
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  # Ignored through .git/info/exclude, not .gitignore: the carry is this machine's, not the project's.
  exclude=$(git -C "$CHECKOUT" rev-parse --git-path info/exclude)
  [[ $exclude == /* ]] || exclude=$CHECKOUT/$exclude
  if [[ $out == "$CHECKOUT"/* ]]; then
    local entry=/${out#"$CHECKOUT"/}/
    grep -qxF "$entry" "$exclude" 2>/dev/null || echo "$entry" >>"$exclude"
  fi
  ansible=ansible-core==$(sed -n 's/^ansible-core==//p' "$CHECKOUT/requirements.txt")
  matplotlib=matplotlib==$(sed -n 's/^matplotlib==//p' "$CHECKOUT/requirements.txt")
  build_bundle "$out" "$force"
  download_systemd "$out"
  download_ansible "$out" 3.12 'ansible_core|resolvelib|pip' "$ansible"
  download_ansible "$out" 3.11 '[^/]+' "$ansible" "$matplotlib"
  download_uv "$out"
  log "done: $out"
  (cd "$out" && du -sh -- * | sort -k2 | sed 's/^/  /' >&2)
}

main "$@"
