# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading a model's weight files into the page cache ahead of its server's load, bounded by free memory.

During a swap the old server still serves while the new model's weights are read, so that the new server's
load, once the old one has stopped, comes from memory rather than from the disk. The weights are read only
when they fit MemAvailable less a reserve, and only until a deadline; nothing is ever written.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MEMINFO = "/proc/meminfo"
DEFAULT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")
MIB = 1024 * 1024
GIB = 1024 * MIB
# Large enough that the per-read overhead is lost in the disk's time, small enough to check the deadline often.
CHUNK_BYTES = 16 * MIB


class PrefetchError(Exception):
    """Weights that cannot be found or read, or a host whose free memory cannot be read; the message says which."""


@dataclass(frozen=True)
class WeightFile:
    path: str
    size: int


@dataclass(frozen=True)
class ReadResult:
    read_bytes: int
    files_read: int
    complete: bool


def meminfo_bytes(text: str) -> dict:
    """Bytes of each field of /proc/meminfo's `text` (MemTotal, MemAvailable, ...); counts such as HugePages_Total
    have no unit and stay as they are."""
    fields = {}
    for line in text.splitlines():
        name, _colon, value = line.partition(":")
        words = value.split()
        if words and words[0].isdigit():
            fields[name.strip()] = int(words[0]) * 1024 if words[1:] == ["kB"] else int(words[0])
    return fields


def mem_available(meminfo_path: str = MEMINFO) -> int:
    """MemAvailable of the host, in bytes: the memory that can be had without swapping, page cache included."""
    try:
        with open(meminfo_path) as meminfo:
            text = meminfo.read()
    except OSError as error:
        raise PrefetchError(f"cannot read the host's free memory from {meminfo_path}: {error.strerror}") from None
    fields = meminfo_bytes(text)
    if "MemAvailable" not in fields:
        raise PrefetchError(f"{meminfo_path} has no MemAvailable (Linux has it since 3.14), so the fit is unknown")
    return fields["MemAvailable"]


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _raise(error: OSError):
    raise PrefetchError(f"cannot list {error.filename}: {error.strerror}")


def find_weight_files(path: str, patterns: Sequence[str] = DEFAULT_PATTERNS) -> list[WeightFile]:
    """The regular files at or under `path` whose names match one of `patterns`, each real file once.

    Symbolic links to files are followed and matched by the link's name (the hub's cache links snapshots/REV/NAME
    to blobs/HASH), and a file reached by several names counts once, under the first the walk meets (it goes in
    sorted order). Links to directories are not followed, so a link loop cannot make the walk endless. Dangling
    links, and links that loop, are passed over.
    """
    if not os.path.exists(path):
        raise PrefetchError(f"no weight files matching {', '.join(patterns)} under {path}: it does not exist")
    if os.path.isdir(path):
        names = []
        for directory, subdirectories, files in os.walk(path, onerror=_raise):
            subdirectories.sort()
            names.extend(os.path.join(directory, name) for name in sorted(files) if _matches(name, patterns))
    else:
        names = [path] if _matches(os.path.basename(path), patterns) else []
    found, seen = [], set()
    for name in names:
        try:
            info = os.stat(name)
        except OSError as error:
            if error.errno in (errno.ENOENT, errno.ELOOP):
                continue
            raise PrefetchError(f"cannot read {name}: {error.strerror}") from None
        identity = (info.st_dev, info.st_ino)
        if stat.S_ISREG(info.st_mode) and identity not in seen:
            seen.add(identity)
            found.append(WeightFile(name, info.st_size))
    if not found:
        raise PrefetchError(
            f"no weight files matching {', '.join(patterns)} under {path}: download the model first "
            "(llmops.vllm.model_weights), or name its directory in path, or its files' names in patterns"
        )
    return found


def skip_reason(total_bytes: int, available_bytes: int, reserve_bytes: int) -> str:
    """Why weights of `total_bytes` are not to be read with `available_bytes` free, or "" when they fit."""
    if total_bytes <= available_bytes - reserve_bytes:
        return ""
    return (
        f"{total_bytes / GIB:.1f} GiB of weights do not fit {available_bytes / GIB:.1f} GiB available "
        f"less the {reserve_bytes / GIB:.1f} GiB reserve"
    )


def read_into_cache(
    files: Sequence[WeightFile],
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
    chunk_bytes: int = CHUNK_BYTES,
) -> ReadResult:
    """Read `files` to their ends, one chunk at a time, until `deadline` (a reading of `clock`) passes.

    The data goes into one reused buffer and is dropped: what stays is the kernel's copy in the page cache.
    """
    buffer = memoryview(bytearray(chunk_bytes))
    read_bytes = files_read = 0
    for weight_file in files:
        try:
            with open(weight_file.path, "rb", buffering=0) as reader:
                # Sequential access doubles the kernel's readahead window, so fewer reads wait on the disk.
                os.posix_fadvise(reader.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
                # Up to the size listed, so that a deadline passing just after a file's last chunk does not
                # count it as cut short.
                file_bytes = 0
                while file_bytes < weight_file.size:
                    if clock() >= deadline:
                        return ReadResult(read_bytes, files_read, complete=False)
                    count = reader.readinto(buffer)
                    if not count:
                        break
                    file_bytes += count
                    read_bytes += count
        except OSError as error:
            raise PrefetchError(f"cannot read {weight_file.path}: {error.strerror}") from None
        files_read += 1
    return ReadResult(read_bytes, files_read, complete=True)


def _gib(count: int) -> str:
    return f"{count / GIB:.2f} GiB"


def _files(count: int) -> str:
    return f"{count} file" if count == 1 else f"{count} files"


def prefetch(
    path: str,
    patterns: Sequence[str] = DEFAULT_PATTERNS,
    reserve_mib: int = 4096,
    timeout: float = 600,
    check_mode: bool = False,
    meminfo_path: str = MEMINFO,
    clock: Callable[[], float] = time.monotonic,
) -> dict:
    """Find the weights under `path`, check that they fit, and read them within `timeout` seconds.

    Returns the weights_prefetch module's result: files, bytes, read_bytes, seconds, mib_per_s,
    mem_available_bytes, prefetched, complete, reason and msg. In check mode nothing is read, and the reason
    is the memory's when the weights do not fit, else "check mode". A timeout is no error: `complete` is false.
    """
    files = find_weight_files(path, patterns)
    total = sum(weight_file.size for weight_file in files)
    available = mem_available(meminfo_path)
    reason = skip_reason(total, available, reserve_mib * MIB)
    result = {
        "files": len(files),
        "bytes": total,
        "read_bytes": 0,
        "seconds": 0.0,
        "mib_per_s": None,
        "mem_available_bytes": available,
        "prefetched": False,
        "complete": True,
        "reason": reason,
    }
    if check_mode:
        verdict = f"skip: {reason}" if reason else f"read {_gib(total)} of {_files(len(files))} into the page cache"
        return result | {"reason": reason or "check mode", "msg": f"check mode: would {verdict}"}
    if reason:
        return result | {"msg": f"skipped: {reason}"}
    start = clock()
    read = read_into_cache(files, start + timeout, clock)
    seconds = clock() - start
    rate = round(read.read_bytes / MIB / seconds, 1) if read.read_bytes and seconds > 0 else None
    result.update(
        read_bytes=read.read_bytes,
        seconds=round(seconds, 3),
        mib_per_s=rate,
        prefetched=read.complete,
        complete=read.complete,
    )
    speed = f" ({rate:.0f} MiB/s)" if rate is not None else ""
    read_gib = _gib(read.read_bytes)
    if read.complete:
        return result | {
            "msg": f"read {read_gib} of {_files(len(files))} into the page cache in {seconds:.1f} s{speed}"
        }
    result["reason"] = (
        f"the {timeout:g} s timeout passed after {read_gib} of {_gib(total)} "
        f"({read.files_read} of {_files(len(files))} read whole); the rest stays on disk"
    )
    return result | {"msg": f"timed out: {result['reason']}{speed}"}
