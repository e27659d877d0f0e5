# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the vLLM unit's sandbox hides from the server or refuses it, from plain data.

The vllm_server role renders a hardened unit (roles/vllm_server/templates/vllm.service.j2). Each rule here says,
before the unit is written, what that unit would break on this host and why: a path that ProtectHome= or
PrivateTmp= hides, a cache that ProtectSystem=strict makes read-only, an NVIDIA device that no DeviceAllow= group
matches in /proc/devices (as systemd resolves them), an allocator setting that the system-call filter breaks.
Pure functions; the role reads the host (stat, /proc/devices) and passes the text in.
"""

from __future__ import annotations

import posixpath
from fnmatch import fnmatchcase

# Directories each setting hides: ProtectHome=yes makes these empty and inaccessible; PrivateTmp=yes gives the
# unit its own, empty /tmp and /var/tmp.
HIDDEN_BY = (
    ("ProtectHome=yes", ("/home", "/root", "/run/user")),
    ("PrivateTmp=yes", ("/tmp", "/var/tmp")),
)
# Variables whose directory the server writes (downloads, compiled kernels). ProtectSystem=strict leaves only
# ReadWritePaths= (the service's home), /dev/shm and the private /tmp writable.
CACHE_VARIABLES = (
    "HF_HOME",
    "HF_HUB_CACHE",
    "VLLM_CACHE_ROOT",
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "XDG_CACHE_HOME",
    "CUDA_CACHE_PATH",
)
WRITABLE_UNDER_STRICT = ("/dev/shm",)
# torch reads its allocator settings from either name (PYTORCH_ALLOC_CONF is the newer one).
ALLOCATOR_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
# NVIDIA's character devices: major 195 is the GPUs (/dev/nvidia0 ...) and /dev/nvidiactl (minor 255); its name
# in /proc/devices is nvidia and nvidiactl on current drivers, nvidia-frontend up to driver 535. The others have
# majors the kernel hands out at load time and are found by name.
NVIDIA_GPU_MAJOR = 195
NVIDIA_DYNAMIC_GROUPS = ("nvidia-uvm", "nvidia-caps")


def _under(path, root):
    return path == root or path.startswith(root + "/")


def hiding_setting(path):
    """The sandbox setting that hides `path` from the unit, or None."""
    normalized = posixpath.normpath(path)
    for setting, roots in HIDDEN_BY:
        for root in roots:
            if _under(normalized, root):
                return setting, root
    return None


def hidden_path_refusals(paths):
    """One message for each path (`{what: [path, resolved path, ...]}`) that ProtectHome= or PrivateTmp= hides."""
    refusals = []
    for what, candidates in paths.items():
        for path in dict.fromkeys(candidate for candidate in candidates if candidate):
            hidden = hiding_setting(path)
            if hidden:
                setting, root = hidden
                refusals.append(
                    f"{what} is {path}, under {root}, which the unit's {setting} hides from the server: move it "
                    "(under /opt or /var/lib/vllm, say), or leave the sandbox off on this host "
                    "(vllm_server_hardening: false)"
                )
                break
    return refusals


def read_only_cache_refusals(environment, home):
    """One message for each cache variable that points where ProtectSystem=strict leaves the server no write."""
    refusals = []
    writable = (posixpath.normpath(home), *WRITABLE_UNDER_STRICT)
    for name in CACHE_VARIABLES:
        value = environment.get(name)
        if not value or not value.startswith("/") or hiding_setting(value):
            continue  # relative values are vLLM's business; hidden ones are refused as paths
        if not any(_under(posixpath.normpath(value), root) for root in writable):
            refusals.append(
                f"the environment's {name} is {value}, which the unit's ProtectSystem=strict makes read-only (only "
                f"{home}, the service's home, is writable): point it under {home}, or leave it out"
            )
    return refusals


def expandable_segments_variable(environment):
    """The variable that turns on torch's expandable segments (`expandable_segments:True`), or None."""
    for name in ALLOCATOR_VARIABLES:
        for option in str(environment.get(name, "")).split(","):
            key, separator, value = option.partition(":")
            if separator and key.strip() == "expandable_segments" and value.strip().lower() == "true":
                return name
    return None


def filter_allows(system_call_filter, call):
    """Whether the SystemCallFilter= lines name `call` in an allow line (systemd adds it back after a ~ line)."""
    if not system_call_filter:
        return True
    return any(call in line.split() for line in system_call_filter if not line.startswith("~"))


def expandable_segments_refusals(environment, system_call_filter, sleep_mode):
    """Why `expandable_segments:True` in the environment cannot run under this unit, if it cannot."""
    name = expandable_segments_variable(environment)
    if name is None:
        return []
    refusals = []
    if sleep_mode:
        refusals.append(
            f"the environment's {name} turns on torch's expandable segments, which vLLM's sleep mode refuses at start "
            "('Expandable segments are not compatible with memory pool'): leave it out, or sleep_mode"
        )
    if not filter_allows(system_call_filter, "pidfd_getfd"):
        refusals.append(
            f"the environment's {name} turns on torch's expandable segments: a process then shares a CUDA tensor "
            "with another through pidfd_getfd, which the unit's system-call filter refuses ('pidfd_getfd: Operation "
            "not permitted', measured on an H200). Leave it out (vLLM takes its KV cache in one piece at start, where "
            "expandable segments save little), or add pidfd_getfd to vllm_server_system_call_filter, knowing that "
            "it lets any process of the service user take open files from the other instances' processes (and "
            "that kernel.yama.ptrace_scope 1 still allows it only from a process to its own descendants)"
        )
    return refusals


def character_devices(proc_devices):
    """`/proc/devices` text -> {major: [names]} of its character devices."""
    devices = {}
    in_character = False
    for line in proc_devices.splitlines():
        line = line.strip()
        if line.endswith(":"):
            in_character = line == "Character devices:"
            continue
        fields = line.split(None, 1)
        if in_character and len(fields) == 2 and fields[0].isdigit():
            devices.setdefault(int(fields[0]), []).append(fields[1])
    return devices


def allowed_majors(device_allow, devices):
    """The majors that systemd's DeviceAllow= entries open, resolved as systemd resolves them (bpf-devices.c):
    `char-*` opens every character device, `char-NUMBER` that major, `char-GLOB` each major whose name in
    /proc/devices matches the glob; a group that matches nothing is skipped silently."""
    majors = set()
    for entry in device_allow:
        group = entry.split()[0]
        if not group.startswith("char-"):
            continue  # a device node path or a block group: not a character group of the driver
        pattern = group[len("char-") :]
        if pattern == "*":
            return set(devices)
        if pattern.isdigit():
            majors.add(int(pattern))
            continue
        majors.update(major for major, names in devices.items() if any(fnmatchcase(name, pattern) for name in names))
    return majors


def uncovered_nvidia_device_refusals(proc_devices, device_allow):
    """One message for each NVIDIA character device of this host that no DeviceAllow= entry opens."""
    devices = character_devices(proc_devices)
    needed = {NVIDIA_GPU_MAJOR: "the GPUs (/dev/nvidia0 ...) and /dev/nvidiactl"} if NVIDIA_GPU_MAJOR in devices else {}
    for group in NVIDIA_DYNAMIC_GROUPS:
        needed.update({major: f"/dev/{group}*" for major, names in devices.items() if group in names})
    allowed = allowed_majors(device_allow, devices)
    return [
        f"major {major} ({', '.join(devices[major])} in /proc/devices), {what}, is opened by no entry of "
        f"vllm_server_device_allow {list(device_allow)}: CUDA would find no device. Add char-{devices[major][0]}"
        for major, what in sorted(needed.items())
        if major not in allowed
    ]


def sandbox_refusals(settings):
    """Every reason why the hardened unit would keep the server from what it needs; empty when there is none.

    settings keys: home (required), paths ({what: [path, resolved path]}), environment, system_call_filter,
    sleep_mode, device (`cuda` checks the devices), device_allow, proc_devices (the host's /proc/devices text;
    empty skips the device check). Pure.
    """
    environment = settings.get("environment") or {}
    refusals = hidden_path_refusals(settings.get("paths") or {})
    refusals += hidden_path_refusals(
        {f"the environment's {name}": [value] for name, value in environment.items() if str(value).startswith("/")}
    )
    refusals += read_only_cache_refusals(environment, settings["home"])
    refusals += expandable_segments_refusals(
        environment, settings.get("system_call_filter") or [], bool(settings.get("sleep_mode"))
    )
    if settings.get("device") == "cuda" and settings.get("proc_devices"):
        refusals += uncovered_nvidia_device_refusals(settings["proc_devices"], settings.get("device_allow") or [])
    return refusals


# The lines of /proc/PID/limits that the unit's LimitNOFILE= and LimitMEMLOCK= set, and the settings that ask.
LIMITS = {
    "nofile": ("Max open files", "vllm_server_limit_nofile", "LimitNOFILE", "open files"),
    "memlock": ("Max locked memory", "vllm_server_limit_memlock", "LimitMEMLOCK", "bytes of locked memory"),
}
# systemd's size suffixes (base 1024), as LimitMEMLOCK= takes them.
SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50, "E": 1 << 60}


def _limit_value(value) -> float | None:
    """A limit as a number (infinity for `infinity` or `unlimited`); None when it is not one."""
    text = str(value).strip()
    if text in ("infinity", "unlimited"):
        return float("inf")
    number, suffix = text.rstrip("KMGTPE"), text[len(text.rstrip("KMGTPE")) :]
    if not number.isdigit() or len(suffix) > 1:
        return None
    return int(number) * SIZE_SUFFIXES[suffix]


def _limit_text(value: float) -> str:
    return "infinity" if value == float("inf") else str(int(value))


def granted_limits(proc_limits: str) -> dict:
    """{nofile, memlock: (soft, hard)} from the text of /proc/PID/limits (infinity for `unlimited`)."""
    granted = {}
    for line in proc_limits.splitlines():
        for key, (label, *_rest) in LIMITS.items():
            if line.startswith(label):
                soft, hard = line[len(label) :].split()[:2]
                granted[key] = (_limit_value(soft), _limit_value(hard))
    return granted


def limit_refusals(proc_limits: str, nofile=0, memlock="") -> list[str]:
    """Each limit that the unit asks for (nofile; memlock, empty for systemd's default) and that systemd, asked the
    same for a unit of its own, did not grant: `proc_limits` is that unit's /proc/self/limits. systemd grants what
    it can (its own hard limit caps what it gives without CAP_SYS_RESOURCE), silently; the refusal says so."""
    asked = {"nofile": int(nofile or 0) or None, "memlock": _limit_value(memlock) if str(memlock or "") else None}
    if str(memlock or "") and asked["memlock"] is None:
        return [f"vllm_server_limit_memlock must be bytes (with K, M, G, ... of 1024) or infinity, got {memlock!r}"]
    granted = granted_limits(proc_limits)
    refusals = []
    for key, wanted in asked.items():
        if wanted is None:
            continue
        _label, setting, directive, unit = LIMITS[key]
        got = granted.get(key)
        if got is None or got[0] < wanted or got[1] < wanted:
            shown = "none read" if got is None else ", ".join(map(_limit_text, got))
            refusals.append(
                f"{setting} asks {directive}={nofile if key == 'nofile' else memlock}, and systemd grants this host's"
                f" units {shown} (soft, hard) {unit}: raise systemd's own limit (its hard limit, from the kernel or"
                f" the container it runs in, caps what it grants) or lower {setting}"
            )
    return refusals
