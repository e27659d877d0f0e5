#!/usr/bin/env bash
# A systemd host made of a machine whose PID 1 is not systemd (the H200 machine; the CPU stand-in that rehearse.sh
# starts): Debian 12's systemd 252 booted as PID 1 of its own PID, mount and cgroup namespaces, ansible-core in a
# venv of its own, and the project's playbooks run from this checkout inside systemd's namespaces, where systemctl
# and journalctl reach it. No network is needed: everything comes from the carry directory that carry.sh builds.
#
# Usage (as root, from the root of the checkout):
#   scripts/gpu-host/host.sh wheelhouse --chunks DIR --python PY --out WHEELHOUSE --model MODEL
#                       vllm_install's wheelhouse from the vLLM bundle's chunks in DIR (with uv's wheel there) and
#                       the bundle's model (config and tokenizer) in MODEL
#   scripts/gpu-host/host.sh up --carry DIR --python PY   install systemd where it is missing (DIR/systemd/*.deb),
#                                                         boot it, install ansible-core (DIR/ansible-cpXY/) for PY
#   scripts/gpu-host/host.sh play INVENTORY PLAYBOOK [ANSIBLE-PLAYBOOK ARGS]
#   scripts/gpu-host/host.sh exec COMMAND [ARGS]          any command in systemd's namespaces (systemctl, journalctl)
#   scripts/gpu-host/host.sh status                       systemd's PID and state
#   scripts/gpu-host/host.sh down                         power systemd off (its units are stopped first)
#
# PY is the Python whose packages the controller may also use (the H200 machine's /opt/torch/.venv/bin/python3,
# which has matplotlib for the benchmark's plot); the playbooks' modules run with the inventory's interpreter.
# Recipe and measurements: ../shared/FIELD_NOTES.md ("The GPU machine"), docs/gpu.md ("A GPU host under systemd").
set -euo pipefail

readonly STATE=${LLMOPS_GPU_HOST_STATE:-/var/lib/llmops-gpu-host}
readonly VENV=$STATE/ansible
readonly PIDFILE=$STATE/systemd.pid
readonly BOOT_TIMEOUT=90
CHECKOUT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
readonly CHECKOUT

log() { echo "gpu-host: $*" >&2; }
die() {
  echo "gpu-host: error: $*" >&2
  exit 1
}

# ---- systemd -------------------------------------------------------------------------------------------------

# Debian's systemd, unpacked over a system that has none. Libraries go in only where their soname is missing, so
# the image's own (newer) libsystemd0 and the like stay; binaries only where the image has none of that name.
install_systemd() {
  local debs=$1 unpacked=$STATE/systemd-root library binary
  [[ -x /usr/lib/systemd/systemd ]] && return
  compgen -G "$debs/*.deb" >/dev/null || die "no systemd on this machine and no .deb files in $debs (carry.sh)"
  log "installing systemd from $debs"
  rm -rf "$unpacked"
  mkdir -p "$unpacked"
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$unpacked"; done
  for library in "$unpacked"/lib/x86_64-linux-gnu/*.so* "$unpacked"/usr/lib/x86_64-linux-gnu/*.so*; do
    [[ -e $library && ! -e /usr/lib/x86_64-linux-gnu/$(basename "$library") ]] && cp -a "$library" /usr/lib/x86_64-linux-gnu/
  done
  mkdir -p /usr/lib/systemd /usr/lib/x86_64-linux-gnu/systemd /etc/systemd/system
  cp -a "$unpacked"/lib/systemd/. /usr/lib/systemd/
  cp -a "$unpacked"/usr/lib/x86_64-linux-gnu/systemd/. /usr/lib/x86_64-linux-gnu/systemd/
  for binary in "$unpacked"/bin/* "$unpacked"/usr/bin/*; do
    [[ -e /usr/bin/$(basename "$binary") ]] || cp -a "$binary" /usr/bin/
  done
  cp -a --update=none "$unpacked"/etc/systemd/. /etc/systemd/
  ldconfig
  rm -rf "$unpacked"
}

systemd_pid() {
  local pid
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == systemd ]] && echo "$pid"
}

in_systemd() {
  local pid
  pid=$(systemd_pid) || die "systemd is not running here (run: $0 up)"
  # The mount namespace holds systemd's /run (its private socket) and /proc; the PID and cgroup namespaces make
  # PIDs and unit cgroups read as systemd sees them. Entering a mount namespace moves to its root: --wd keeps the
  # working directory (the checkout, for a playbook).
  nsenter -t "$pid" -m -p -C --wd="$PWD" -- "$@"
}

# The cgroup2 hierarchy: /sys/fs/cgroup on a pure cgroup v2 machine (the H200 machine), /sys/fs/cgroup/unified on
# a hybrid one (the CPU machines, whose v2 hierarchy has no controllers).
cgroup2_root() {
  local root
  for root in /sys/fs/cgroup /sys/fs/cgroup/unified; do
    [[ $(stat -f -c %T "$root" 2>/dev/null) == cgroup2fs ]] && { echo "$root"; return; }
  done
  die "no cgroup2 hierarchy mounted at /sys/fs/cgroup or /sys/fs/cgroup/unified"
}

# The cgroups of earlier boots, deepest first (a cgroup goes once it has no process and no child).
remove_cgroups() {
  local cgroup
  for cgroup in "$1"/llmops-gpu-host-*; do
    [[ -d $cgroup ]] && find "$cgroup" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  return 0
}

boot_systemd() {
  local root cgroup controller unshare_pid pid state
  if pid=$(systemd_pid); then
    log "systemd already runs as PID $pid"
    return
  fi
  root=$(cgroup2_root)
  # A fresh cgroup for the new systemd, with the root's controllers delegated to it. The cgroup namespace makes it
  # systemd's root; cgroup2 must be mounted again inside it, or systemd exits at once ("Failed to create
  # /init.scope control group").
  for controller in $(cat "$root/cgroup.controllers"); do
    echo "+$controller" >"$root/cgroup.subtree_control" 2>/dev/null || log "controller $controller not delegated"
  done
  cgroup=$root/llmops-gpu-host-$$
  mkdir -p "$cgroup"
  mkdir -p "$STATE"
  (
    echo "$BASHPID" >"$cgroup/cgroup.procs"
    # container=other: systemd runs as a container's init (no hardware, no getty).
    export container=other
    exec setsid unshare --pid --fork --mount-proc --cgroup --propagation private \
      sh -c 'umount -l /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec /usr/lib/systemd/systemd' \
      </dev/null >"$STATE/systemd.log" 2>&1
  ) &
  unshare_pid=$!
  for _ in $(seq 1 100); do
    pid=$(ps -o pid= --ppid "$unshare_pid" | tr -d ' ' || true)
    [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == systemd ]] && break
    sleep 0.1
  done
  [[ -n $pid ]] || die "systemd did not start ($(tail -5 "$STATE/systemd.log"))"
  echo "$pid" >"$PIDFILE"
  # systemctl answers nothing until systemd's private socket exists, a moment after its start: ask again until then.
  local deadline=$((SECONDS + BOOT_TIMEOUT))
  state=""
  while [[ -z $state ]] && ((SECONDS < deadline)); do
    state=$(timeout "$((deadline - SECONDS))" nsenter -t "$pid" -m -p -C -- systemctl is-system-running --wait 2>/dev/null || true)
    [[ -n $state ]] || sleep 0.2
  done
  case $state in
  running) log "systemd 252 booted as PID $pid (state running)" ;;
  degraded)
    in_systemd systemctl --failed --no-pager >&2 || true
    die "systemd as PID $pid is degraded (failed units above)"
    ;;
  *) die "systemd as PID $pid is '${state:-unknown}' after ${BOOT_TIMEOUT} s ($(tail -5 "$STATE/systemd.log"))" ;;
  esac
}

# ---- Ansible ---------------------------------------------------------------------------------------------------

# ansible-core in a venv of its own, from the carried wheels, each installed as it is (the carry brings what the
# base lacks; carry.sh says which). The base interpreter's packages come after the venv's own: on the H200 machine
# its torch venv's jinja2, PyYAML, MarkupSafe, packaging, and matplotlib for the benchmark's plot.
install_ansible() {
  local python=$1 carry=$2 wheels version site pip
  version=$(sed -n 's/^ansible-core==//p' "$CHECKOUT/requirements.txt")
  if [[ -x $VENV/bin/ansible-playbook ]] &&
    [[ $("$VENV/bin/python" -c 'import ansible.release; print(ansible.release.__version__)') == "$version" ]]; then
    return
  fi
  wheels=$carry/ansible-$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  pip=$(compgen -G "$wheels/pip-*.whl" | head -1) || die "no pip wheel in $wheels (carry.sh)"
  log "installing ansible-core $version for $python from $wheels"
  # No ensurepip is needed (Ubuntu's Python lacks it): pip runs from its own wheel.
  "$python" -m venv --without-pip --clear "$VENV"
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$python" -c 'import sys; print("\n".join(p for p in sys.path if p.endswith("-packages")))' >"$site/llmops-base.pth"
  find "$wheels" -name '*.whl' ! -name 'pip-*' -print0 | xargs -0 "$VENV/bin/python" "$pip/pip" install --quiet \
    --no-index --no-deps --disable-pip-version-check --no-warn-script-location
  "$VENV/bin/python" -c 'import ansible.release, jinja2, yaml, matplotlib' ||
    die "the controller's venv lacks a package that neither $python nor $wheels has"
}

link_collection() {
  # ansible.cfg names .build/collections, where this checkout is the collection llmops.vllm.
  mkdir -p "$CHECKOUT/.build/collections/ansible_collections/llmops"
  ln -sfn ../../../.. "$CHECKOUT/.build/collections/ansible_collections/llmops/vllm"
}

# ---- the vLLM bundle -------------------------------------------------------------------------------------------

# The archives of the bundle (../shared/gpu/build-vllm-bundle.sh) from their chunks, each checked against SHA256SUMS;
# core is required, an optional archive is taken when all its chunks are there.
extract_bundle() {
  local chunks=$1 python=$2 work=$3 archive parts
  [[ -f $chunks/SHA256SUMS ]] || die "no SHA256SUMS in $chunks"
  rm -rf "$work"
  mkdir -p "$work"
  for archive in core opt_moe opt_fa2; do
    parts=$(cd "$chunks" && ls "${archive}"_[0-9][0-9] 2>/dev/null || true)
    if [[ -z $parts ]] || (($(wc -l <<<"$parts") != $(grep -cE " ${archive}_[0-9]+\$" "$chunks/SHA256SUMS"))); then
      [[ $archive == core ]] && die "the core chunks of the bundle are not all in $chunks: ${parts:-none}"
      continue
    fi
    (cd "$chunks" && grep -E " ${archive}_[0-9]+\$" SHA256SUMS | sha256sum -c --quiet -) ||
      die "a chunk of $archive does not match SHA256SUMS"
    # shellcheck disable=SC2086 # the chunk names, sorted, one per line
    (cd "$chunks" && cat $parts) >"$work/$archive.tar.xz"
    (cd "$work" && grep " $archive.tar.xz\$" "$chunks/SHA256SUMS" | sha256sum -c --quiet -) ||
      die "$archive.tar.xz does not match SHA256SUMS"
    "$python" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
      "$work/$archive.tar.xz" "$work/$archive"
    rm "$work/$archive.tar.xz"
  done
}

# vllm_install's wheelhouse for a host with its own CUDA torch (docs/install.md, "On a host whose CUDA PyTorch is
# already installed"): vLLM re-zipped from the bundle, the bundle's dependency wheels, uv's wheel and the
# requirements list; and the bundle's model (config and tokenizer, no weights).
cmd_wheelhouse() {
  local chunks="" python="" out="" model="" work add=()
  while (($#)); do
    case $1 in
    --chunks) chunks=$2 && shift 2 ;;
    --python) python=$2 && shift 2 ;;
    --out) out=$2 && shift 2 ;;
    --model) model=$2 && shift 2 ;;
    *) die "wheelhouse: unknown argument $1" ;;
    esac
  done
  [[ -n $chunks && -n $python && -n $out && -n $model ]] || die "wheelhouse needs --chunks, --python, --out and --model"
  local start=$SECONDS uv
  uv=$(compgen -G "$chunks/uv-*.whl" | head -1) || die "no uv wheel in $chunks (carry.sh)"
  work=$STATE/bundle
  extract_bundle "$chunks" "$python" "$work"
  for optional in opt_fa2 opt_moe; do [[ -d $work/$optional ]] && add+=(--add "$work/$optional"); done
  "$python" "$CHECKOUT/scripts/bundle-wheelhouse.py" --site "$work/core/site" --deps "$work/core/wheels" \
    "${add[@]}" --copy "$uv" "$out"
  rm -rf "$model"
  mkdir -p "$(dirname "$model")"
  cp -a "$work/core/model/tinyllama" "$model"
  rm -rf "$work"
  log "wheelhouse $out and model $model from the bundle in $((SECONDS - start)) s"
}

# ---- commands --------------------------------------------------------------------------------------------------

cmd_up() {
  local carry="" python=""
  while (($#)); do
    case $1 in
    --carry) carry=$(cd "$2" && pwd) && shift 2 ;;
    --python) python=$2 && shift 2 ;;
    *) die "up: unknown argument $1" ;;
    esac
  done
  [[ -n $carry && -n $python ]] || die "up needs --carry DIR and --python PY"
  local start=$SECONDS
  install_systemd "$carry/systemd"
  boot_systemd
  install_ansible "$python" "$carry"
  link_collection
  log "up in $((SECONDS - start)) s: systemd PID $(systemd_pid), $("$VENV/bin/ansible-playbook" --version | head -1)"
}

cmd_play() {
  (($# >= 2)) || die "play needs INVENTORY PLAYBOOK"
  local inventory=$1 playbook=$2
  shift 2
  cd "$CHECKOUT"
  in_systemd env ANSIBLE_CONFIG="$CHECKOUT/ansible.cfg" "$VENV/bin/ansible-playbook" -i "$inventory" "$playbook" "$@"
}

cmd_status() {
  local pid
  if pid=$(systemd_pid); then
    echo "systemd: PID $pid, $(in_systemd systemctl is-system-running || true)"
  else
    echo "systemd: not running"
  fi
  [[ -x $VENV/bin/ansible-playbook ]] && echo "ansible: $("$VENV/bin/ansible-playbook" --version | head -1)"
  return 0
}

cmd_down() {
  local pid
  pid=$(systemd_pid) || {
    log "systemd is not running"
    return
  }
  in_systemd systemctl poweroff --no-block || true
  for _ in $(seq 1 120); do
    [[ -d /proc/$pid ]] || break
    sleep 0.5
  done
  [[ -d /proc/$pid ]] && die "systemd (PID $pid) still runs 60 s after poweroff"
  rm -f "$PIDFILE"
  remove_cgroups "$(cgroup2_root)"
  log "systemd powered off"
}

main() {
  (($#)) || {
    sed -n '/^# Usage/,/^#$/p' "$0" >&2
    exit 2
  }
  local command=$1
  shift
  case $command in
  wheelhouse) cmd_wheelhouse "$@" ;;
  up) cmd_up "$@" ;;
  play) cmd_play "$@" ;;
  exec) in_systemd "$@" ;;
  status) cmd_status ;;
  down) cmd_down ;;
  *) die "unknown command $command" ;;
  esac
}

main "$@"
