# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan of a weights fetch: what to keep, resume or fetch again, and whether those bytes fit.

`plan_fetch` compares a source's file list with the weights directory and its manifest, and says what to
keep, resume (from which byte ranges) or fetch again, and how many bytes that needs; `check_space` refuses
before anything is written when those bytes do not fit. The fetch itself is in `fetch`.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ansible_collections.llmops.vllm.plugins.module_utils.weights.listing import (
    PARTIAL_DIR,
    RemoteFile,
    WeightsError,
    read_manifest,
)

CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class Step:
    """What to do with one file: keep it, resume it, or fetch it whole.

    `have` holds the byte ranges [start, end) already on disk for a resume: in the partial copy
    (`resume_from="partial"`) or at the file's own place, where a shorter copy was left
    (`resume_from="file"`). `sha256` is the local copy's hash, when planning knows it.
    """

    file: RemoteFile
    action: str
    have: tuple = ()
    reason: str = ""
    resume_from: str = ""
    sha256: str | None = None

    @property
    def offset(self):
        """Bytes already there."""
        return sum(end - start for start, end in self.have)

    @property
    def bytes_needed(self):
        return 0 if self.action == "keep" else self.file.size - self.offset


class ByteRanges:
    """Byte ranges [start, end) of one file, kept sorted and merged: what a partial copy holds."""

    def __init__(self, ranges=()):
        self.ranges = []
        for start, end in ranges:
            self.add(start, end)

    def add(self, start, end):
        if end <= start:
            return
        index = bisect.bisect_left(self.ranges, [start, start])
        if index and self.ranges[index - 1][1] >= start:
            index -= 1
        merged_end = end
        last = index
        while last < len(self.ranges) and self.ranges[last][0] <= end:
            start = min(start, self.ranges[last][0])
            merged_end = max(merged_end, self.ranges[last][1])
            last += 1
        self.ranges[index:last] = [[start, merged_end]]

    def covered(self):
        return sum(end - start for start, end in self.ranges)

    def contiguous_end(self, offset):
        """The end of the run of bytes held from `offset` on (`offset` itself when that byte is missing)."""
        index = bisect.bisect_right(self.ranges, [offset, float("inf")]) - 1
        if index >= 0 and self.ranges[index][0] <= offset < self.ranges[index][1]:
            return self.ranges[index][1]
        return offset

    def missing(self, size):
        """The ranges of [0, size) not held."""
        gaps, position = [], 0
        for start, end in self.ranges:
            if start > position:
                gaps.append((position, min(start, size)))
            position = max(position, end)
        if position < size:
            gaps.append((position, size))
        return [(start, end) for start, end in gaps if start < end]

    def as_list(self):
        return [list(byte_range) for byte_range in self.ranges]


def _whole_number(value):
    return isinstance(value, int) and not isinstance(value, bool)


def recorded_ranges(record, size):
    """The byte ranges a manifest's record of a partial copy names, or None when they make no sense."""
    have = record.get("have") if isinstance(record, dict) else None
    if not isinstance(have, list):
        return None
    ranges = []
    for item in have:
        whole_numbers = isinstance(item, list) and all(_whole_number(value) for value in item)
        if not whole_numbers or len(item) != 2 or not 0 <= item[0] < item[1] <= size:
            return None
        ranges.append(tuple(item))
    return tuple(tuple(byte_range) for byte_range in ByteRanges(ranges).ranges)


def sha256_of(path, offset=None):
    """SHA-256 object of a file's first `offset` bytes (the whole file when None)."""
    digest = hashlib.sha256()
    remaining = os.path.getsize(path) if offset is None else offset
    with open(path, "rb") as handle:
        while remaining > 0:
            chunk = handle.read(min(CHUNK_BYTES, remaining))
            if not chunk:
                break
            digest.update(chunk)
            remaining -= len(chunk)
    return digest


def recorded_unchanged(record, stat):
    return bool(record) and record.get("size") == stat.st_size and record.get("mtime_ns") == stat.st_mtime_ns


def _resume_partial(file, dest, partial):
    """A resume step from the partial copy a fetch left, when the manifest's record of it (the same source,
    size and hash, or no hash on both sides) still holds."""
    if not isinstance(partial, dict) or partial.get("size") != file.size or partial.get("sha256") != file.sha256:
        return None
    have = recorded_ranges(partial, file.size)
    try:
        complete_size = os.path.getsize(os.path.join(dest, PARTIAL_DIR, file.path)) == file.size
    except OSError:
        return None
    if not have or not complete_size:
        return None
    held = sum(end - start for start, end in have)
    return Step(file, "resume", have, f"partial: {held} of {file.size} bytes", "partial")


def plan_step(file, dest, record, same_source=True, partial=None, ranges=True):
    """Compare one source file with its local copy and the manifest's records of it.

    A missing file resumes from the partial copy an interrupted fetch left, when the manifest says
    which byte ranges it holds; `ranges=False` (a fetch that cannot ask for ranges) fetches it whole.
    A shorter copy is resumed; a longer one is fetched again. A copy of the right size is kept when the
    manifest saw it unchanged (same size and mtime) with the expected hash; otherwise it is hashed and
    compared with the source's hash, or with the hash the manifest recorded when the source has none.
    A copy with no hash to check is trusted for its size only when the manifest names the same source.
    """
    path = os.path.join(dest, file.path)
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        resumed = _resume_partial(file, dest, partial) if ranges else None
        return resumed or Step(file, "fetch", reason="missing")
    if stat.st_size < file.size:
        reason = f"partial: {stat.st_size} of {file.size} bytes"
        if not ranges or stat.st_size == 0:
            return Step(file, "fetch", reason=reason + ("" if ranges else ", fetched whole"))
        return Step(file, "resume", ((0, stat.st_size),), reason, "file")
    if stat.st_size > file.size:
        return Step(file, "fetch", reason=f"corrupt: {stat.st_size} bytes, the source has {file.size}")
    expected = file.sha256 or (record or {}).get("sha256")
    if expected is None and not same_source:
        return Step(file, "fetch", reason="no hash to compare, and the directory's manifest names another source")
    if expected is not None and recorded_unchanged(record, stat) and record.get("sha256") == expected:
        return Step(file, "keep", reason="verified before, unchanged", sha256=expected)
    local = sha256_of(path).hexdigest()
    if expected is None:
        return Step(file, "keep", reason="size matches (no hash known)", sha256=local)
    if local != expected:
        return Step(file, "fetch", reason="corrupt: SHA-256 differs")
    return Step(file, "keep", reason="SHA-256 matches", sha256=local)


def plan_fetch(files, dest, source_description, ranges=True, workers=1):
    """One step per file; the manifest's records count only when it names the same source.

    Copies that must be hashed are hashed `workers` at a time (hashlib releases the GIL).
    """
    manifest = read_manifest(dest)
    same_source = manifest.get("source") == source_description
    records = manifest.get("files", {}) if same_source else {}
    partials = manifest.get("missing", {}) if same_source else {}
    if not isinstance(records, dict) or not isinstance(partials, dict):
        records, partials = {}, {}

    def plan_one(file):
        return plan_step(file, dest, records.get(file.path), same_source, partials.get(file.path), ranges)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(plan_one, files))


def nearest_existing_directory(path):
    """The directory whose filesystem will hold `path`: itself, or its closest existing parent."""
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def blocking_file(path):
    """The closest existing non-directory among `path` and its parents: a destination cannot be made under it."""
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        if os.path.lexists(path):
            return path
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return None


def required_free_bytes(needed, margin, reserve):
    """Free bytes a download of `needed` bytes requires: the bytes, a fraction more, and a reserve."""
    if needed == 0:
        return 0
    return needed + int(needed * margin) + reserve


def human_bytes(count):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count} B" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def check_space(needed, free, margin, reserve, where):
    required = required_free_bytes(needed, margin, reserve)
    if required > free:
        raise WeightsError(
            f"not enough free space for the weights on {where}: the download needs {needed} bytes "
            f"({human_bytes(needed)}), {required} bytes ({human_bytes(required)}) with the margin of "
            f"{margin:.0%} and the reserve of {human_bytes(reserve)}, but only {free} bytes "
            f"({human_bytes(free)}) are free. Free space there or choose another vllm_weights_root; "
            "nothing was written."
        )
    return required


def disk_usage_free(path):
    return shutil.disk_usage(nearest_existing_directory(path)).free
