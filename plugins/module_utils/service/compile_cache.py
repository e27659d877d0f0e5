# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""An instance's compile cache as one archive that identical hosts share, and the key that says which hosts those are.

vLLM keeps what it compiles for a model (torch.compile's artifacts, Inductor's, Triton's and DeepGEMM's kernels)
under VLLM_CACHE_ROOT, which the server role sets per vLLM release and catalog entry. A start that finds that
directory filled does not compile again what it holds. The archive carries its key (KEY.json, its first member):
the vLLM release, the entry, the serve command less its address, the device (each GPU's model, driver and compute
capability, or the CPU's model and instruction set), and vLLM's own variables in the unit's environment, by which
vLLM keys its compile cache too. A host imports an archive only when its own key is the same.

The archive also carries vLLM's answers about model classes (MODEL_INFO_DIRECTORY), which the unit links from the
entry's directory to one directory of the release: a host that unpacks it resolves the model's config without
importing its class first, as the host that packed it did after its first start. vLLM checks each answer against
its class's source file, so an answer of another release is never used.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile

from ansible_collections.llmops.vllm.plugins.module_utils.service.serve_command import MODEL_INFO_DIRECTORY
from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import without_flags

KEY_MEMBER = "KEY.json"
CACHE_MEMBER = "cache"
KEY_FORMAT = 1
# Flags of the serve command that place the server on the network: two hosts of a fleet differ there and compile
# the same.
ADDRESS_FLAGS = ("--host", "--port")
# vLLM's variables that say where things are or hold a secret: vLLM leaves them out of its own key, and so does this.
ENVIRONMENT_IGNORED = frozenset({"VLLM_API_KEY", "VLLM_CACHE_ROOT", "VLLM_HOST_IP", "VLLM_PORT"})
NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# What an archive may hold: the key, then directories and regular files under cache/.
MEMBER_TYPES = (tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.AREGTYPE)
# The service's umask (UMask=0077): what the server writes, only its user reads.
PRIVATE_DIRECTORY_MODE = 0o700


class CompileCacheError(ValueError):
    """An archive or a unit that cannot be used, with what to do."""


def command_digest(argv: list[str]) -> str:
    """sha256 of the serve command without the flags that only place it on the network."""
    return hashlib.sha256(json.dumps(without_flags(argv, ADDRESS_FLAGS)).encode()).hexdigest()


def environment_digest(environment: dict) -> str:
    """sha256 of vLLM's own variables (VLLM_*) in the unit's environment but ENVIRONMENT_IGNORED: hosts that differ
    there (a thread binding, a kernel switch) compile differently, and vLLM would not use each other's cache."""
    kept = {
        name: value
        for name, value in environment.items()
        if name.startswith("VLLM_") and name not in ENVIRONMENT_IGNORED
    }
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def cuda_device(query_csv: str, gpus: list[int]) -> dict:
    """The instance's GPUs from `nvidia-smi --query-gpu=index,name,driver_version,compute_cap --format=csv,noheader`.

    `gpus` are the instance's indices; none means every GPU of the host.
    """
    found = {}
    for line in query_csv.strip().splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 4 or not fields[0].isdigit():
            raise CompileCacheError(f"cannot read nvidia-smi's line {line!r}")
        found[int(fields[0])] = " / ".join(fields[1:])
    missing = [gpu for gpu in gpus if gpu not in found]
    if missing or not found:
        raise CompileCacheError(f"nvidia-smi lists GPUs {sorted(found)}, not the instance's {missing or gpus}")
    return {"kind": "cuda", "gpus": sorted({found[gpu] for gpu in (gpus or found)})}


def cpu_device(cpuinfo: str, isa_level: str) -> dict:
    """The CPU's model (the first `model name` of /proc/cpuinfo) and the instruction set vLLM's CPU build uses."""
    model = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "unknown"
    )
    return {"kind": "cpu", "cpu": model, "isa": isa_level}


def cache_key(record: dict, argv: list[str], environment: dict, device: dict) -> dict:
    """What a compile cache is valid for: the vLLM release, the catalog entry, its serve command and environment,
    the device."""
    return {
        "format": KEY_FORMAT,
        "vllm": record["vllm_version"],
        "model": record["model"],
        "command": command_digest(argv),
        "environment": environment_digest(environment),
        "device": device,
    }


def archive_name(key: dict) -> str:
    """The archive's file name: the entry, the release and a digest of the whole key."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return f"{NAME_UNSAFE.sub('-', key['model'])}-{NAME_UNSAFE.sub('-', key['vllm'])}-{digest}.tar.gz"


def key_differences(wanted: dict, found: dict) -> list[str]:
    """What differs between this host's key and an archive's, one phrase per field; [] when they are the same."""
    return [
        f"{field} {found.get(field)!r} where this host has {wanted.get(field)!r}"
        for field in sorted(set(wanted) | set(found))
        if wanted.get(field) != found.get(field)
    ]


def contents(path: str) -> tuple[int, int]:
    """The regular files under `path` and their bytes, links not followed (an archive holds nothing else); (0, 0)
    when it is missing."""
    files = size = 0
    for directory, _subdirectories, names in os.walk(path):
        for name in names:
            status = os.lstat(os.path.join(directory, name))
            if stat.S_ISREG(status.st_mode):
                files += 1
                size += status.st_size
    return files, size


def write_archive(path: str, key: dict, archive: str) -> None:
    """Write the cache at `path` and its key into `archive` (gzip'd tar), atomically; the answers about model classes
    that the entry's link to its release's directory leads to go in as the entry's own."""
    descriptor, scratch = tempfile.mkstemp(dir=os.path.dirname(archive), prefix=".llmops-", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as scratch_file, tarfile.open(fileobj=scratch_file, mode="w:gz") as tar:
            text = json.dumps(key, indent=2, sort_keys=True).encode()
            member = tarfile.TarInfo(KEY_MEMBER)
            member.size = len(text)
            tar.addfile(member, io.BytesIO(text))
            tar.add(path, arcname=CACHE_MEMBER, filter=_plain_member)
            answers = os.path.join(path, MODEL_INFO_DIRECTORY)
            if os.path.islink(answers) and os.path.isdir(answers):
                tar.add(os.path.realpath(answers), arcname=f"{CACHE_MEMBER}/{MODEL_INFO_DIRECTORY}",
                        filter=_plain_member)  # fmt: skip
        os.chmod(scratch, 0o600)
        os.replace(scratch, archive)
    except BaseException:
        if os.path.exists(scratch):
            os.unlink(scratch)
        raise


def _plain_member(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Directories and regular files, without their owner (the importing host's service user gets them)."""
    if member.type not in MEMBER_TYPES:
        return None
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    return member


def read_key(archive: str) -> dict:
    """The key an archive carries; CompileCacheError when it is not such an archive."""
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            first = tar.next()
            if first is None or first.name != KEY_MEMBER or not first.isfile():
                raise CompileCacheError(f"{archive} does not begin with {KEY_MEMBER}: not a compile cache archive")
            key = json.loads(tar.extractfile(first).read())
    except (OSError, tarfile.TarError, ValueError) as error:
        if isinstance(error, CompileCacheError):
            raise
        raise CompileCacheError(f"cannot read {archive} as a compile cache archive: {error}") from error
    if not isinstance(key, dict):
        raise CompileCacheError(f"{archive}'s {KEY_MEMBER} is not an object")
    return key


def _checked_members(tar: tarfile.TarFile, archive: str) -> list[tarfile.TarInfo]:
    """The members under cache/, each a directory or a regular file with a relative path that stays inside."""
    members = []
    for member in tar.getmembers():
        if member.name == KEY_MEMBER:
            continue
        parts = member.name.split("/")
        if parts[0] != CACHE_MEMBER or member.name.startswith("/") or ".." in parts or member.type not in MEMBER_TYPES:
            raise CompileCacheError(f"{archive} holds {member.name!r}, which a compile cache archive never does")
        members.append(member)
    return members


def unpack(archive: str, path: str, owner: tuple[int, int]) -> int:
    """Put the archive's cache at `path` (missing, or holding no file: the unit's link to its release's modelinfos
    at most), owned by `owner`; the number of files.

    Unpacked beside `path` and renamed into place: the server finds the whole cache or none of it.
    """
    parent = os.path.dirname(path)
    _make_parents(parent, owner)
    staging = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(path)}.importing-")
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            members = _checked_members(tar, archive)
            for member in members:
                target = os.path.join(staging, *member.name.split("/")[1:])
                if member.isdir():
                    os.makedirs(target, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with tar.extractfile(member) as source, open(target, "wb") as copy:
                    shutil.copyfileobj(source, copy)
                os.chmod(target, member.mode & 0o700)
        for directory, _subdirectories, names in os.walk(staging):
            os.chown(directory, *owner)
            os.chmod(directory, PRIVATE_DIRECTORY_MODE)
            for name in names:
                os.chown(os.path.join(directory, name), *owner)
        if os.path.isdir(path):
            shutil.rmtree(path)  # no file in it (contents): directories and links, which rmtree does not follow
        os.rename(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sum(1 for member in members if not member.isdir())


def _make_parents(directory: str, owner: tuple[int, int]) -> None:
    """Make `directory` and its missing parents, private to `owner`, as the server would have."""
    if os.path.isdir(directory):
        return
    _make_parents(os.path.dirname(directory), owner)
    os.mkdir(directory, PRIVATE_DIRECTORY_MODE)
    os.chown(directory, *owner)


def owner_of_nearest(path: str) -> tuple[int, int]:
    """The owner of `path` or of its nearest existing parent: the service user, whose home the cache is under."""
    while not os.path.exists(path):
        path = os.path.dirname(path)
    status = os.stat(path)
    return status.st_uid, status.st_gid
