"""Reading weights into the page cache: which files, whether they fit, how far the reading goes before its deadline,
and (on a filesystem that evicts) that the kernel really keeps what was read."""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import shutil
import subprocess

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.weights import page_cache
from ansible_collections.llmops.vllm.plugins.module_utils.weights.page_cache import (
    GIB,
    MIB,
    PrefetchError,
    ReadResult,
    WeightFile,
    find_weight_files,
    mem_available,
    meminfo_bytes,
    prefetch,
    read_into_cache,
    skip_reason,
)

MEMINFO = """\
MemTotal:       24683520 kB
MemFree:        19293184 kB
MemAvailable:   {available} kB
Buffers:          131072 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
"""


class SteppingClock:
    """A clock that reads `times` one call after another, then keeps the last."""

    def __init__(self, *times):
        self.times = list(times)
        self.calls = 0

    def __call__(self):
        now = self.times[min(self.calls, len(self.times) - 1)]
        self.calls += 1
        return now


def write(path, size, byte=b"w"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(byte * size)
    return path


def meminfo_file(tmp_path, available_kib):
    path = tmp_path / "meminfo"
    path.write_text(MEMINFO.format(available=available_kib))
    return str(path)


def refuse_to_read(*_args, **_kwargs):
    raise AssertionError("the weights were read")


# ---- what to read --------------------------------------------------------------------------------------------


def hub_cache(tmp_path):
    """A model in the hub's cache: two snapshots link to the same blobs, one shard changed in the second."""
    repo = tmp_path / "models--org--model"
    write(repo / "blobs" / "aaa", 1000)
    write(repo / "blobs" / "bbb", 2000)
    write(repo / "blobs" / "ccc", 3000)
    write(repo / "blobs" / "cfg", 10, b"{")
    for revision, second in (("r1", "bbb"), ("r2", "ccc")):
        snapshot = repo / "snapshots" / revision
        snapshot.mkdir(parents=True)
        (snapshot / "model-1.safetensors").symlink_to("../../blobs/aaa")
        (snapshot / "model-2.safetensors").symlink_to(f"../../blobs/{second}")
        (snapshot / "config.json").symlink_to("../../blobs/cfg")
    return repo


def test_links_to_one_file_count_it_once(tmp_path):
    repo = hub_cache(tmp_path)
    found = find_weight_files(str(repo))
    assert found == [
        WeightFile(str(repo / "snapshots" / "r1" / "model-1.safetensors"), 1000),
        WeightFile(str(repo / "snapshots" / "r1" / "model-2.safetensors"), 2000),
        WeightFile(str(repo / "snapshots" / "r2" / "model-2.safetensors"), 3000),
    ]


def test_a_hard_link_counts_once_and_dangling_links_are_passed_over(tmp_path):
    shard = write(tmp_path / "model.safetensors", 100)
    os.link(shard, tmp_path / "copy.safetensors")
    (tmp_path / "gone.safetensors").symlink_to(tmp_path / "missing")
    (tmp_path / "loop.safetensors").symlink_to(tmp_path / "loop.safetensors")
    assert find_weight_files(str(tmp_path)) == [WeightFile(str(tmp_path / "copy.safetensors"), 100)]


def test_links_to_directories_are_not_walked(tmp_path):
    write(tmp_path / "model" / "model.safetensors", 100)
    (tmp_path / "model" / "loop").symlink_to(tmp_path / "model")
    (tmp_path / "model" / "elsewhere").symlink_to(write(tmp_path / "other" / "x.safetensors", 5).parent)
    assert find_weight_files(str(tmp_path / "model")) == [WeightFile(str(tmp_path / "model/model.safetensors"), 100)]


def test_only_regular_files_whose_names_match_are_read(tmp_path):
    for name, size in (("a.safetensors", 1), ("b.bin", 2), ("c.pt", 3), ("d.pth", 4), ("e.gguf", 5)):
        write(tmp_path / "sub" / name, size)
    write(tmp_path / "config.json", 6)
    write(tmp_path / "model.SAFETENSORS", 7)
    (tmp_path / "dir.safetensors").mkdir()
    os.mkfifo(tmp_path / "pipe.bin")
    found = find_weight_files(str(tmp_path))
    assert [(os.path.basename(file.path), file.size) for file in found] == [
        ("a.safetensors", 1), ("b.bin", 2), ("c.pt", 3), ("d.pth", 4), ("e.gguf", 5),
    ]  # fmt: skip
    assert [file.size for file in find_weight_files(str(tmp_path), ["*.gguf", "config.*"])] == [6, 5]


def test_one_file_named_by_path_is_read_when_it_matches(tmp_path):
    shard = write(tmp_path / "model.gguf", 42)
    assert find_weight_files(str(shard)) == [WeightFile(str(shard), 42)]
    with pytest.raises(PrefetchError, match=r"no weight files matching \*\.safetensors under .*model\.gguf"):
        find_weight_files(str(shard), ["*.safetensors"])


def test_a_missing_path_says_so(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(PrefetchError) as raised:
        find_weight_files(str(missing))
    assert str(raised.value) == (
        f"no weight files matching *.safetensors, *.bin, *.pt, *.pth, *.gguf under {missing}: it does not exist"
    )


def test_a_directory_without_weights_says_what_to_do(tmp_path):
    write(tmp_path / "config.json", 6)
    with pytest.raises(PrefetchError) as raised:
        find_weight_files(str(tmp_path), ["*.safetensors"])
    assert str(raised.value) == (
        f"no weight files matching *.safetensors under {tmp_path}: download the model first "
        "(llmops.vllm.model_weights), or name its directory in path, or its files' names in patterns"
    )


def test_a_directory_that_cannot_be_listed_fails_rather_than_missing_its_files(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    write(locked / "model.safetensors", 1)
    scandir = os.scandir

    def refuse_locked(path):
        if os.fspath(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(locked))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refuse_locked)  # as for a user without the right to list it
    with pytest.raises(PrefetchError, match=re.escape(f"cannot list {locked}: Permission denied")):
        find_weight_files(str(tmp_path))


# ---- whether it fits -----------------------------------------------------------------------------------------


def test_meminfo_fields_in_bytes():
    fields = meminfo_bytes(MEMINFO.format(available=1024))
    assert fields["MemAvailable"] == 1024 * 1024
    assert fields["MemTotal"] == 24683520 * 1024
    assert fields["HugePages_Total"] == 0


def test_mem_available_reads_the_file_given(tmp_path):
    assert mem_available(meminfo_file(tmp_path, 2048)) == 2 * MIB
    (tmp_path / "old").write_text("MemTotal: 1024 kB\n")
    with pytest.raises(PrefetchError, match="has no MemAvailable"):
        mem_available(str(tmp_path / "old"))
    with pytest.raises(PrefetchError, match=r"cannot read the host's free memory from .*: No such file"):
        mem_available(str(tmp_path / "none"))


def test_weights_fit_up_to_the_reserve_exactly():
    assert skip_reason(36 * GIB, 40 * GIB, 4 * GIB) == ""
    assert skip_reason(36 * GIB + 1, 40 * GIB, 4 * GIB) == (
        "36.0 GiB of weights do not fit 40.0 GiB available less the 4.0 GiB reserve"
    )


def test_weights_that_do_not_fit_are_not_read(tmp_path, monkeypatch):
    write(tmp_path / "model.safetensors", 3 * MIB)
    monkeypatch.setattr(page_cache, "read_into_cache", refuse_to_read)
    # 5 GiB available, all of it the reserve: no room for 3 MiB.
    result = prefetch(str(tmp_path), reserve_mib=5 * 1024, meminfo_path=meminfo_file(tmp_path, 5 * 1024 * 1024))
    reason = "0.0 GiB of weights do not fit 5.0 GiB available less the 5.0 GiB reserve"
    assert result == {
        "files": 1, "bytes": 3 * MIB, "read_bytes": 0, "seconds": 0.0, "mib_per_s": None,
        "mem_available_bytes": 5 * GIB, "prefetched": False, "complete": True, "reason": reason,
        "msg": f"skipped: {reason}",
    }  # fmt: skip


def test_check_mode_gives_the_verdict_and_reads_nothing(tmp_path, monkeypatch):
    write(tmp_path / "model.safetensors", 3 * MIB)
    monkeypatch.setattr(page_cache, "read_into_cache", refuse_to_read)
    meminfo = meminfo_file(tmp_path, 8 * 1024)
    fits = prefetch(str(tmp_path), reserve_mib=4, check_mode=True, meminfo_path=meminfo)
    assert (fits["prefetched"], fits["read_bytes"], fits["reason"]) == (False, 0, "check mode")
    assert fits["msg"] == "check mode: would read 0.00 GiB of 1 file into the page cache"
    too_big = prefetch(str(tmp_path), reserve_mib=6, check_mode=True, meminfo_path=meminfo)
    assert too_big["reason"].endswith("do not fit 0.0 GiB available less the 0.0 GiB reserve")
    assert too_big["msg"] == f"check mode: would skip: {too_big['reason']}"


# ---- reading -------------------------------------------------------------------------------------------------


def test_reads_every_file_to_its_end(tmp_path):
    write(tmp_path / "a.bin", 10)
    write(tmp_path / "b.bin", 7)
    files = find_weight_files(str(tmp_path))
    assert read_into_cache(files, deadline=1.0, clock=SteppingClock(0.0), chunk_bytes=4) == ReadResult(17, 2, True)


def test_timeout_stops_reading_mid_file(tmp_path):
    write(tmp_path / "a.bin", 10)
    write(tmp_path / "b.bin", 10)
    files = find_weight_files(str(tmp_path))
    # Chunks of 4 bytes: a.bin in 3 reads, then b.bin's first read, then the clock jumps past the deadline.
    clock = SteppingClock(0.0, 0.0, 0.0, 0.0, 99.0)
    assert read_into_cache(files, deadline=10.0, clock=clock, chunk_bytes=4) == ReadResult(14, 1, False)


def test_a_deadline_passing_after_the_last_chunk_still_counts_as_complete(tmp_path):
    files = [WeightFile(str(write(tmp_path / "a.bin", 8)), 8)]
    assert read_into_cache(files, deadline=10.0, clock=SteppingClock(0.0, 0.0, 99.0), chunk_bytes=4).complete


def test_prefetch_reports_the_time_and_the_rate(tmp_path):
    write(tmp_path / "model.safetensors", 2 * MIB)
    # start, one check before the only chunk, end: 2 s.
    result = prefetch(str(tmp_path), reserve_mib=0, meminfo_path=meminfo_file(tmp_path, 8 * 1024),
                      clock=SteppingClock(10.0, 11.0, 12.0))  # fmt: skip
    assert result == {
        "files": 1, "bytes": 2 * MIB, "read_bytes": 2 * MIB, "seconds": 2.0, "mib_per_s": 1.0,
        "mem_available_bytes": 8 * MIB, "prefetched": True, "complete": True, "reason": "",
        "msg": "read 0.00 GiB of 1 file into the page cache in 2.0 s (1 MiB/s)",
    }  # fmt: skip


def test_prefetch_timed_out_returns_what_it_read(tmp_path):
    write(tmp_path / "a.safetensors", MIB)
    write(tmp_path / "b.safetensors", MIB)
    # start, a's chunk, then the clock jumps past the 5 s timeout before b's.
    result = prefetch(str(tmp_path), reserve_mib=0, timeout=5, meminfo_path=meminfo_file(tmp_path, 8 * 1024),
                      clock=SteppingClock(0.0, 0.0, 8.0))  # fmt: skip
    assert (result["read_bytes"], result["prefetched"], result["complete"]) == (MIB, False, False)
    assert (result["seconds"], result["mib_per_s"]) == (8.0, 0.1)
    assert result["reason"] == (
        "the 5 s timeout passed after 0.00 GiB of 0.00 GiB (1 of 2 files read whole); the rest stays on disk"
    )
    assert result["msg"] == f"timed out: {result['reason']} (0 MiB/s)"


def test_an_unreadable_file_fails_with_its_name(tmp_path):
    missing = WeightFile(str(tmp_path / "gone.bin"), 1)
    with pytest.raises(PrefetchError, match=re.escape(f"cannot read {missing.path}: No such file or directory")):
        read_into_cache([missing], deadline=1.0, clock=SteppingClock(0.0))


# ---- the page cache, really ----------------------------------------------------------------------------------


def filesystem_type(path):
    """The type of the filesystem holding `path`: that of the longest mount point above it in /proc/mounts."""
    real = os.path.realpath(path)
    best, kind = "", None
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _device, point, fstype = line.split()[:3]
            point = point.replace("\\040", " ")
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, kind = point, fstype
    return kind


def resident_by_mincore(path, size):
    """Bytes of `path` in the page cache, by mincore(2) over a read-only mapping (which faults nothing in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vector = (ctypes.c_ubyte * pages)()
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            if libc.mincore(address, size, vector) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)
    return min(size, sum(page & 1 for page in vector) * mmap.PAGESIZE)


def resident_by_fincore(path):
    fincore = shutil.which("fincore")
    if fincore is None:
        raise OSError("no fincore")
    command = [fincore, "--bytes", "--noheadings", "--raw", "--output", "RES", str(path)]
    return int(subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip())


def resident_bytes(path, size):
    try:
        return resident_by_mincore(path, size)
    except (OSError, AttributeError):
        try:
            return resident_by_fincore(path)
        except (OSError, ValueError, subprocess.CalledProcessError):
            pytest.skip("neither mincore(2) through ctypes nor util-linux fincore can read page cache residency")


def test_the_reader_fills_the_page_cache(tmp_path):
    kind = filesystem_type(tmp_path)
    if kind in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is on {kind}, whose pages are never evicted, so a fill cannot be seen")
    size = 64 * MIB
    shard = tmp_path / "model.safetensors"
    with open(shard, "wb") as out:
        for _mib in range(size // MIB):
            out.write(os.urandom(MIB))
        out.flush()
        os.fsync(out.fileno())
        os.posix_fadvise(out.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    before = resident_bytes(shard, size)
    if before > size // 8:
        pytest.skip(f"{kind} kept {before} of {size} bytes in the page cache after POSIX_FADV_DONTNEED")
    result = read_into_cache([WeightFile(str(shard), size)], deadline=float("inf"))
    assert result == ReadResult(size, 1, True)
    assert resident_bytes(shard, size) == size
