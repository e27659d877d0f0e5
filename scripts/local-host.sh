#!/usr/bin/env bash
# Local test host: a Debian 12 (bookworm) container that boots real systemd
# under podman, so the collection's roles can be tried against systemd units
# on a laptop or CI runner that has no spare VM.
#
# Usage: scripts/local-host.sh image [--force]  build the image if absent (or again), make podman run it
#        scripts/local-host.sh up                start the container, wait for systemd
#        scripts/local-host.sh check             verify the running container
#        scripts/local-host.sh status            print image/container/systemd state
#        scripts/local-host.sh down              remove the container
#
# Environment:
#   LLMOPS_WHEELHOUSE     host dir mounted read-only at /opt/wheelhouse
#                         (default /var/cache/llmops-vllm/wheelhouse; fill it
#                         with scripts/wheelhouse.sh)
#   LLMOPS_LOCAL_NAME     name (and hostname) of the container (default llmops-vllm-local);
#                         the molecule scenarios start their hosts under their own names
#   LLMOPS_LOCAL_PORT     host port on 127.0.0.1 for the container's port 8000 (default 8000;
#                         empty publishes no port)
#   LLMOPS_LOCAL_TMPFS    size-limited tmpfs mounts in the container, "DIR:SIZE ..." (e.g.
#                         "/srv/small:1m"): a small filesystem for tests of disk-space checks,
#                         which root in the container cannot mount without CAP_SYS_ADMIN
#   LLMOPS_LOCAL_CPUS     the most CPUs the container may use (e.g. 1.5; default: no limit), applied
#                         at every `up`. vLLM's CPU build under load takes every core, and on a
#                         small machine a process started beside it (podman exec, ansible) then
#                         waits minutes for a core; a limit keeps part of a core for them
#   LLMOPS_DEBIAN_MIRROR  Debian mirror for the image (default: the host's apt source for bookworm)
#   LLMOPS_LOCAL_SYS_ADMIN=1  add CAP_SYS_ADMIN to the container. Without it
#                         systemd cannot create mount namespaces and silently
#                         ignores ProtectSystem=, ProtectHome=, PrivateTmp=,
#                         ProtectKernelTunables=, ProtectControlGroups= (the
#                         unit still starts); DynamicUser= fails (226/NAMESPACE).
#                         With it they are enforced as on a real host, but
#                         root in the container may mount and remount (cgroup v1
#                         hierarchies, /proc/sys): weaker isolation from the host.
#
# Runs as root on a Debian 12 host; installs podman, runc, debootstrap if missing.
# Settings apply when the container is created: `down` then `up` to change them.
set -euo pipefail

readonly IMAGE=localhost/llmops-vllm-debian12:latest
readonly NAME=${LLMOPS_LOCAL_NAME:-llmops-vllm-local}
readonly WHEELHOUSE=${LLMOPS_WHEELHOUSE:-/var/cache/llmops-vllm/wheelhouse}
readonly PORT=${LLMOPS_LOCAL_PORT-8000}
readonly SYS_ADMIN=${LLMOPS_LOCAL_SYS_ADMIN:-0}
readonly TMPFS=${LLMOPS_LOCAL_TMPFS:-}
readonly TMPFS_LABEL=io.llmops-vllm.tmpfs
readonly CPUS=${LLMOPS_LOCAL_CPUS:-}
readonly BOOT_TIMEOUT=60
readonly PACKAGES=(podman runc debootstrap python3)
# python3-apt lets Ansible's apt module run in check mode.
readonly IMAGE_PACKAGES=systemd,systemd-sysv,python3,python3-venv,python3-apt,dbus,iproute2,procps,ca-certificates
readonly RECIPE_LABEL=io.llmops-vllm.recipe
readonly SHIM_NAME=runc-no-rlimits
readonly SHIM_PATH=/usr/local/libexec/llmops-vllm/$SHIM_NAME
readonly CONTAINERS_CONF=/etc/containers/containers.conf
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly SCRIPT_DIR

log() { echo "local-host: $*"; }
die() { echo "local-host: error: $*" >&2; exit 1; }

usage() {
  sed -n '/^# Usage:/,/^#$/{/^#$/d; s/^# //; p}' "$0" >&2
  exit 2
}

ensure_packages() {
  local pkg missing=()
  for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
      missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return
  log "installing ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
}

# The host's own apt source for SUITE: the one mirror known to be reachable
# (on CI hosts the other configured repositories are not).
host_apt_uri() {
  local uri
  # shellcheck disable=SC2016 # $(REPO_URI) is apt's format syntax, not the shell's
  uri=$(apt-get indextargets --no-release-info --format '$(REPO_URI)' \
    'Created-By: Packages' 'Target-Of: deb' "Release: $1" | awk 'NR == 1')
  echo "${uri%/}"
}

container_exists() { podman container exists "$NAME"; }

container_tmpfs() {
  local mounts
  mounts=$(podman container inspect -f "{{ index .Config.Labels \"$TMPFS_LABEL\" }}" "$NAME")
  [[ $mounts == "<no value>" ]] || echo "$mounts"
}

container_running() {
  [[ $(podman container inspect -f '{{.State.Running}}' "$NAME" 2>/dev/null) == true ]]
}

# After the machine restarts from a snapshot, podman may still record a container as running (or
# stopping) whose processes are gone: it can then be neither started nor entered.
container_stale() {
  local status
  status=$(podman container inspect -f '{{.State.Status}}' "$NAME" 2>/dev/null) || return 1
  [[ $status != @(created|configured|exited|stopped) ]] && ! podman exec "$NAME" true 2>/dev/null
}

# ---- image ---------------------------------------------------------------

ROOTFS=
cleanup_rootfs() {
  [[ -n $ROOTFS && -d $ROOTFS ]] || return 0
  # debootstrap bind-mounts /dev, /proc, /sys into the target; never delete
  # through a mount left behind by a failed run.
  awk -v dir="$ROOTFS/" 'index($2, dir) == 1 { print $2 }' /proc/mounts |
    sort -r | xargs -r umount -l
  rm -rf --one-file-system "$ROOTFS"
}

# Point the image's apt at the same mirror, so `apt-get install` works in the
# container, and fetch its package lists. (Nothing needs masking: this image
# boots to `running` as is.)
configure_rootfs() {
  local root=$1 mirror=$2 security=$3
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  # Package lists in the image let Ansible's apt module answer in check mode on a new container;
  # the roles refresh lists older than a day, so a long-cached image does not install stale versions.
  chroot "$root" apt-get update -qq
}

build_image() {
  local mirror security start=$SECONDS
  mirror=${LLMOPS_DEBIAN_MIRROR:-$(host_apt_uri bookworm)}
  [[ -n $mirror ]] || die "no apt source for bookworm on this host; set LLMOPS_DEBIAN_MIRROR"
  security=$(host_apt_uri bookworm-security)
  security=${security:-${mirror}-security}
  ROOTFS=$(mktemp -d /var/tmp/llmops-vllm-rootfs.XXXXXX)
  trap cleanup_rootfs EXIT
  log "debootstrap bookworm from $mirror into $ROOTFS"
  if ! debootstrap --variant=minbase --include="$IMAGE_PACKAGES" bookworm "$ROOTFS" "$mirror" >/dev/null; then
    tail -n 20 "$ROOTFS/debootstrap/debootstrap.log" >&2 || true
    die "debootstrap failed (end of its log above)"
  fi
  configure_rootfs "$ROOTFS" "$mirror" "$security"
  log "importing $IMAGE"
  tar -C "$ROOTFS" -c . |
    podman import --quiet --change 'CMD ["/sbin/init"]' --change "LABEL $RECIPE_LABEL=$(image_recipe)" - "$IMAGE" >/dev/null
  cleanup_rootfs
  log "built $IMAGE in $((SECONDS - start)) s ($(podman image inspect -f '{{.Size}}' "$IMAGE" | numfmt --to=iec))"
}

# What goes into the image, as one digest: an image cached from an older recipe is rebuilt, not reused.
image_recipe() {
  { echo "$IMAGE_PACKAGES"; declare -f configure_rootfs; } | sha256sum | cut -c1-16
}

ensure_image() {
  local built_from
  built_from=$(podman image inspect -f "{{ index .Labels \"$RECIPE_LABEL\" }}" "$IMAGE" 2>/dev/null || true)
  if [[ ${1-} != --force && $built_from == "$(image_recipe)" ]]; then
    log "image $IMAGE present"
    return
  fi
  [[ -z $built_from ]] || log "image $IMAGE was built from another recipe; rebuilding"
  build_image
}

# ---- podman runtime ------------------------------------------------------

# Point podman's default runtime at the shim, keeping every other setting of
# an existing containers.conf. Line-based because TOML has no writer in the
# standard library; the result is re-read with tomllib before it replaces the
# file.
register_shim() {
  python3 - "$CONTAINERS_CONF" "$SHIM_NAME" "$SHIM_PATH" <<'EOF'
import os, re, sys, tomllib

path, name, wrapper = sys.argv[1:]
text = open(path).read() if os.path.exists(path) else ""
lines = text.splitlines()

def set_key(table, key, value):
    header = re.compile(r"\s*\[\s*%s\s*\]\s*(#.*)?$" % re.escape(table))
    start = next((i for i, l in enumerate(lines) if header.match(l)), None)
    if start is None:
        lines.extend(([""] if lines else []) + [f"[{table}]", f"{key} = {value}"])
        return
    end = next((i for i in range(start + 1, len(lines))
                if re.match(r"\s*\[", lines[i])), len(lines))
    for i in range(start + 1, end):
        if re.match(r'\s*"?%s"?\s*=' % re.escape(key), lines[i]):
            lines[i] = f"{key} = {value}"
            return
    lines.insert(start + 1, f"{key} = {value}")

set_key("engine", "runtime", f'"{name}"')
set_key("engine.runtimes", name, f'["{wrapper}"]')
new = "\n".join(lines) + "\n"
try:
    engine = tomllib.loads(new)["engine"]
    assert engine["runtime"] == name and engine["runtimes"][name] == [wrapper]
except (tomllib.TOMLDecodeError, KeyError, AssertionError) as e:
    sys.exit(f"local-host: cannot edit {path} safely ({e!r}); add by hand:\n"
             f'[engine]\nruntime = "{name}"\n[engine.runtimes]\n{name} = ["{wrapper}"]')
if new != text:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(new)
    os.replace(path + ".tmp", path)
    print(f"local-host: registered {name} as podman's runtime in {path}")
EOF
}

# Plain podman is right wherever it works. Only where runc/crun cannot set the
# OCI rlimits (no CAP_SYS_RESOURCE; crun then also trips over hybrid cgroups)
# install and register the runtime shim that drops them.
ensure_runtime() {
  local err
  err=$(podman run --rm --net=none "$IMAGE" true 2>&1) && return
  grep -qiE 'rlimit|cgroups in hybrid mode' <<<"$err" ||
    die "podman cannot run a container:"$'\n'"$err"
  log "podman run fails here (${err##*$'\n'}); using $SHIM_NAME"
  install -D -m 0755 "$SCRIPT_DIR/$SHIM_NAME" "$SHIM_PATH"
  register_shim
  err=$(podman run --rm --net=none "$IMAGE" true 2>&1) ||
    die "podman still cannot run a container with $SHIM_NAME:"$'\n'"$err"
}

# ---- container -----------------------------------------------------------

systemd_state() {
  podman exec "$NAME" systemctl is-system-running 2>/dev/null || true
}

# Wait until PID 1 has finished booting. The test host must reach `running`:
# a failed unit there would hide (or fake) failures of the units under test.
wait_for_systemd() {
  local deadline=$((SECONDS + BOOT_TIMEOUT)) state
  while ((SECONDS < deadline)); do
    state=$(timeout 10 podman exec "$NAME" systemctl is-system-running --wait 2>/dev/null || true)
    case $state in
    running) return ;;
    degraded)
      podman exec "$NAME" systemctl --failed --no-pager >&2
      die "systemd in $NAME is degraded (failed units above)"
      ;;
    esac
    sleep 1
  done
  podman logs --tail 40 "$NAME" >&2 || true
  die "systemd in $NAME not running after ${BOOT_TIMEOUT}s (state '${state:-unknown}'; container log above)"
}

# On a hybrid cgroup host podman gives the container only cgroup v1 hierarchies, from which
# systemd gets no notice that a unit's cgroup has emptied: every stop of a unit that leaves a
# process for the final SIGKILL (vLLM's resource tracker does) then waits out TimeoutStopSec
# and ends in "timeout". The host's cgroup2 hierarchy gives systemd that notice, as on a real
# host. On a pure cgroup v2 host podman mounts cgroup2 itself and nothing is added.
host_cgroup2_volume() {
  local unified=/sys/fs/cgroup/unified
  [[ $(stat -f -c %T "$unified" 2>/dev/null) == cgroup2fs ]] && echo "$unified:$unified:rw"
  return 0
}

start_container() {
  local opts=() cgroup2
  [[ $SYS_ADMIN == 1 ]] && opts+=(--cap-add SYS_ADMIN)
  for mount in $TMPFS; do
    [[ $mount == /*:+([0-9])[kmg] ]] || die "LLMOPS_LOCAL_TMPFS: '$mount' is not DIR:SIZE (e.g. /srv/small:1m)"
    opts+=(--mount "type=tmpfs,destination=${mount%:*},tmpfs-size=${mount##*:}")
  done
  [[ -n $PORT ]] && opts+=(-p "127.0.0.1:$PORT:8000")
  cgroup2=$(host_cgroup2_volume)
  [[ -n $cgroup2 ]] && opts+=(-v "$cgroup2")
  if [[ ! -d $WHEELHOUSE ]]; then
    log "$WHEELHOUSE does not exist; creating it empty (fill it with scripts/wheelhouse.sh)"
    mkdir -p "$WHEELHOUSE"
  fi
  podman run -d --name "$NAME" --hostname "$NAME" \
    --systemd=always --shm-size=2g \
    -v "$WHEELHOUSE:/opt/wheelhouse:ro" \
    --label "$TMPFS_LABEL=$TMPFS" \
    "${opts[@]}" \
    "$IMAGE" /sbin/init >/dev/null
}

# The CPU limit changes on a running container: it needs no new one. 0 lifts an earlier limit.
limit_cpus() {
  podman update --cpus "${CPUS:-0}" "$NAME" >/dev/null
}

cmd_up() {
  local start=$SECONDS
  [[ -z $CPUS || $CPUS =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "LLMOPS_LOCAL_CPUS: '$CPUS' is not a number of CPUs (e.g. 1.5)"
  ensure_packages
  ensure_image
  ensure_runtime
  if container_exists &&
    [[ $(podman container inspect -f '{{.Image}}' "$NAME") != "$(podman image inspect -f '{{.Id}}' "$IMAGE")" ]]; then
    log "$NAME runs an older image; replacing it"
    podman rm -f "$NAME" >/dev/null
  fi
  if container_exists && [[ $(container_tmpfs) != "$TMPFS" ]]; then
    log "$NAME was created with other tmpfs mounts than '$TMPFS'; replacing it"
    podman rm -f "$NAME" >/dev/null
  fi
  if container_stale; then
    log "$NAME is recorded as $(podman container inspect -f '{{.State.Status}}' "$NAME") but its processes are gone; replacing it"
    podman rm -f "$NAME" >/dev/null
  fi
  if container_running; then
    if [[ $(systemd_state) == running ]]; then
      limit_cpus
      log "$NAME already up (systemd running${CPUS:+, at most $CPUS CPUs})"
      return
    fi
  elif container_exists; then
    log "starting existing container $NAME"
    podman start "$NAME" >/dev/null
  else
    log "creating container $NAME (${PORT:+127.0.0.1:$PORT -> 8000, }$WHEELHOUSE -> /opt/wheelhouse)"
    start_container
  fi
  wait_for_systemd
  limit_cpus
  log "$NAME up, systemd running${CPUS:+, at most $CPUS CPUs} ($((SECONDS - start)) s)"
}

cmd_down() {
  if container_exists; then
    podman rm -f "$NAME" >/dev/null
    log "removed $NAME"
  else
    log "$NAME does not exist"
  fi
}

cmd_status() {
  if podman image exists "$IMAGE"; then
    echo "image:     $IMAGE"
  else
    echo "image:     absent"
  fi
  if ! container_exists; then
    echo "container: absent"
    return
  fi
  echo "container: $(podman container inspect -f '{{.State.Status}}' "$NAME")"
  container_running || return 0
  echo "systemd:   $(systemd_state)"
  echo "port:      $(podman port "$NAME" 8000/tcp)"
}

# One line per property the roles and their tests rely on.
cmd_check() {
  container_running || die "$NAME is not running (run: $0 up)"
  podman exec "$NAME" bash -euo pipefail -c '
    ok() { echo "ok   $*"; }
    [[ $(systemctl is-system-running) == running ]]; ok "systemd running"
    shm=$(df --output=size -B1M /dev/shm | tail -1); ((shm >= 2048)); ok "/dev/shm $((shm)) MiB"
    n=$(find /opt/wheelhouse -maxdepth 1 -name "*.whl" | wc -l); ok "/opt/wheelhouse visible ($n wheels)"
    d=$(mktemp -d); python3 -m venv "$d/venv"; "$d/venv/bin/python" -m pip --version >/dev/null
    rm -rf "$d"; ok "python3 -m venv works"
    apt-get update -qq; ok "apt-get update works"
    if systemd-run --wait --collect -q -p ProtectSystem=strict /usr/bin/test ! -w /etc; then
      ok "systemd sandboxing (mount namespaces) enforced"
    else
      echo "note systemd ignores ProtectSystem=, PrivateTmp=, ... here (see LLMOPS_LOCAL_SYS_ADMIN)"
    fi
  ' || die "check failed"
}

main() {
  (($# >= 1)) || usage
  local cmd=$1
  shift
  case $cmd in
  image)
    [[ $# == 0 || ($# == 1 && $1 == --force) ]] || usage
    ensure_packages
    ensure_image "$@"
    ensure_runtime
    ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  check) cmd_check ;;
  *) usage ;;
  esac
}

main "$@"
