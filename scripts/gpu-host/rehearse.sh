#!/usr/bin/env bash
# The GPU host's run rehearsed on this CPU machine, at no device time: a stand-in for the GPU machine (a privileged
# podman container of the local host's Debian 12 image whose PID 1 is `sleep`, not systemd), into which a copy of
# this checkout goes as it goes to the GPU machine. There host.sh boots the image's own systemd 252 with the same
# recipe (PID, mount and cgroup namespaces), installs ansible-core from the carried wheels, and the runner
# (benchmarks/gpu_host/run.py) runs every playbook with the CPU build of vLLM and the tiny models of
# benchmarks/gpu_host/catalog/cpu. A container, not this machine itself: booting a second systemd here would start
# this machine's own enabled units (podman-restart, postgresql, ...) beside the ones that run now.
#
# Usage: scripts/gpu-host/rehearse.sh [--keep] [--steps a,b,...] OUTDIR
#   Builds nothing: run scripts/gpu-host/carry.sh first (it needs ansible-cp311/), and scripts/local-host.sh image.
#   Holds the shared heavy lock for the whole run (vLLM serves on both cores). --keep leaves the stand-in running
#   (podman exec -it llmops-gpu-host-rehearsal bash; scripts/gpu-host/host.sh exec journalctl ...); the next
#   rehearsal replaces it.
# Environment: LLMOPS_WHEELHOUSE (/var/cache/llmops-vllm/wheelhouse, mounted at /opt/wheelhouse), LLMOPS_LOCAL_CPUS
#   (CPUs of the stand-in, default 1.5: vLLM's CPU build takes every core it has), LLMOPS_HEAVY_LOCK.
set -euo pipefail

CHECKOUT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
readonly CHECKOUT
readonly NAME=llmops-gpu-host-rehearsal
readonly IMAGE=localhost/llmops-vllm-debian12:latest
readonly WHEELHOUSE=${LLMOPS_WHEELHOUSE:-/var/cache/llmops-vllm/wheelhouse}
readonly CPUS=${LLMOPS_LOCAL_CPUS:-1.5}
readonly LOCK=${LLMOPS_HEAVY_LOCK:-/tmp/llmops-heavy.lock}
readonly INSIDE=/srv/gpu-host

log() { echo "rehearse: $*" >&2; }
die() {
  echo "rehearse: error: $*" >&2
  exit 1
}

start_stand_in() {
  local options=(--privileged --shm-size=2g --cpus "$CPUS" -v "$WHEELHOUSE:/opt/wheelhouse:ro")
  # On a hybrid-cgroup machine the container sees only v1 hierarchies: the v2 one is mounted in for systemd.
  [[ $(stat -f -c %T /sys/fs/cgroup/unified 2>/dev/null) == cgroup2fs ]] &&
    options+=(-v /sys/fs/cgroup/unified:/sys/fs/cgroup/unified:rw)
  remove_stand_in
  podman run -d --name "$NAME" --hostname "$NAME" "${options[@]}" "$IMAGE" sleep infinity >/dev/null
}

# The stand-in, and the cgroups that its systemd made in this machine's cgroup2 hierarchy (deepest first).
remove_stand_in() {
  podman rm -f "$NAME" >/dev/null 2>&1 || true
  local cgroup
  for cgroup in /sys/fs/cgroup/unified/llmops-gpu-host-*; do
    [[ -d $cgroup ]] && find "$cgroup" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  return 0
}

# What a GPU command gets: the checkout's files, tracked and untracked but not ignored, and the carried paths.
copy_checkout() {
  (cd "$CHECKOUT" && { git ls-files -co --exclude-standard -z && printf '%s\0' .gpucarry/ansible-cp311; } |
    tar --null -T - -c) | podman exec -i "$NAME" bash -c "mkdir -p $INSIDE/checkout && tar -x -C $INSIDE/checkout"
}

main() {
  local keep=0 steps="" out
  while (($#)); do
    case $1 in
    --keep) keep=1 && shift ;;
    --steps) steps=$2 && shift 2 ;;
    *) break ;;
    esac
  done
  (($# == 1)) || die "usage: $0 [--keep] [--steps a,b,...] OUTDIR"
  out=$1
  [[ -d $CHECKOUT/.gpucarry/ansible-cp311 ]] || die "no .gpucarry/ansible-cp311: run scripts/gpu-host/carry.sh"
  podman image exists "$IMAGE" || die "no image $IMAGE: run scripts/local-host.sh image"
  mkdir -p "$out"
  start_stand_in
  ((keep)) || trap remove_stand_in EXIT
  copy_checkout
  log "stand-in $NAME up; the run follows"
  podman exec "$NAME" bash -c "
    set -euo pipefail
    cd $INSIDE/checkout
    bash scripts/gpu-host/host.sh up --carry .gpucarry --python /usr/bin/python3
    python3 benchmarks/gpu_host/run.py --inventory inventories/gpu-host-rehearsal \
      --catalog benchmarks/gpu_host/catalog/cpu --out $INSIDE/out --no-sleep --stream-tokens 1500 \
      ${steps:+--steps $steps}
  " || log "the run failed (its results so far follow)"
  podman cp "$NAME:$INSIDE/out/." "$out/"
  log "results in $out: $(ls "$out" | tr '\n' ' ')"
}

# The heavy lock, held by flock itself (-o): a descriptor of it inherited by the stand-in, which outlives this
# script with --keep, would hold the lock for everyone.
if [[ -z ${LLMOPS_REHEARSAL_LOCKED:-} ]]; then
  log "waiting for $LOCK"
  exec flock -o "$LOCK" env LLMOPS_REHEARSAL_LOCKED=1 "$0" "$@"
fi
main "$@"
