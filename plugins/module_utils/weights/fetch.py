# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fetch: several files at once, a large file split into byte ranges over several connections.

Each worker takes a file nobody works on yet; when none is left, it splits the largest range still in
flight and takes its second half, so that the last files of a model come over every connection. A
file is written into `PARTIAL_DIR` at the offsets its ranges start at, and the manifest records which
ranges have landed, so an interrupted fetch resumes each range where it stopped.

Each file's SHA-256 is computed while the file lands, by the workers themselves: the bytes that
continue the hashed prefix are hashed from memory as they arrive, and bytes that landed ahead of it
(a second half) are read back when the prefix reaches them. Files hash on as many cores as there are
workers (hashlib releases the GIL). A file moves to its real name only once its hash is checked; a
hash that differs gets the file fetched once more, then the fetch fails and the file is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import tempfile
import threading
import time
from collections import OrderedDict, deque

from ansible_collections.llmops.vllm.plugins.module_utils.weights.listing import (
    MANIFEST_NAME,
    PARTIAL_DIR,
    WeightsError,
    read_manifest,
)
from ansible_collections.llmops.vllm.plugins.module_utils.weights.plan import ByteRanges, recorded_unchanged
from ansible_collections.llmops.vllm.plugins.module_utils.weights.sources import RangeIgnored, SourceError

# What one read from the source takes, and one write: measured on 2 cores against 1, 2 and 8 MiB, 4 MiB
# cost the least CPU per byte (each worker holds one such buffer).
READ_BYTES = 4 << 20
# A range in flight is split for an idle worker only when both halves are at least this long.
SPLIT_BYTES = 16 << 20
# Attempts at one range after the source failed mid-way, and the pause before the first (it grows).
RETRIES = 3
RETRY_DELAY = 0.5
MANIFEST_INTERVAL = 1.0


def default_workers(cpus=None):
    """Connections (and hashing threads) that fit a host: two per core it may use, from 4 to 32.

    Each byte costs the same CPU however many connections carry it; more threads than that only contend
    for the interpreter (on 2 cores, with 4 MiB reads, 8 workers cost 1.23 to 1.75 CPU s/GB, 4 workers 1.10
    to 1.20; docs/weights.md).
    """
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(32, max(4, 2 * cpus))


class Progress:
    """Bytes done of bytes needed, written at most once per `interval` seconds to a JSON file.

    Workers call it from several threads; `begin`/`end` keep the files in flight, the oldest first.
    """

    def __init__(self, path, needed, interval=1.0, clock=time.monotonic):
        self.path = path
        self.needed = needed
        self.done = 0
        self.interval = interval
        self.clock = clock
        self.started = clock()
        self.last_write = None
        self.in_flight = OrderedDict()
        self._lock = threading.Lock()

    def begin(self, file):
        with self._lock:
            self.in_flight[file] = True

    def end(self, file):
        with self._lock:
            self.in_flight.pop(file, None)

    def add_needed(self, count):
        with self._lock:
            self.needed += count

    def advance(self, count):
        with self._lock:
            self.done += count
            now = self.clock()
            due = self.last_write is None or now - self.last_write >= self.interval
            if self.path and due:
                self.last_write = now
                self.write(now)

    def snapshot(self, now=None):
        elapsed = (self.clock() if now is None else now) - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        remaining = self.needed - self.done
        in_flight = list(self.in_flight)
        return {
            "done_bytes": self.done,
            "needed_bytes": self.needed,
            "percent": round(100.0 * self.done / self.needed, 1) if self.needed else 100.0,
            "bytes_per_second": round(rate),
            "eta_seconds": round(remaining / rate) if rate > 0 else None,
            "elapsed_seconds": round(elapsed, 3),
            "file": in_flight[0] if in_flight else None,
            "files_in_flight": len(in_flight),
        }

    def remove(self):
        """The fetch is over: the job's result says the rest."""
        if self.path and os.path.exists(self.path):
            os.remove(self.path)

    def write(self, now=None):
        _write_json(self.path, self.snapshot(now))


def _write_json(path, data, **options):
    directory = os.path.dirname(path) or "."
    with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, encoding="utf-8") as handle:
        json.dump(data, handle, **options)
    os.replace(handle.name, path)


class Manifest:
    """The weights directory's `.llmops-weights.json`: the verified files, and the files still missing.

    A missing file's record says how big it is, its hash, and the byte ranges of it already on disk
    (`have`), so that a later run resumes it and a mirror serving this directory refuses to pass on a
    half model. `complete` is true once nothing is missing.
    """

    def __init__(self, dest, description, paths, commit=None):
        existing = read_manifest(dest)
        records = existing.get("files", {}) if existing.get("source") == description else {}
        self.path = os.path.join(dest, MANIFEST_NAME)
        self.description = description
        self.commit = commit
        self.records = {path: record for path, record in records.items() if path in paths}
        self._lock = threading.Lock()

    def verified(self, path, full_path, sha256):
        stat = os.stat(full_path)
        with self._lock:
            self.records[path] = {"size": stat.st_size, "sha256": sha256, "mtime_ns": stat.st_mtime_ns}

    def write(self, missing):
        """Write it with `missing`: {path: {"size", "sha256", "have": [[start, end], ...]}}."""
        with self._lock:
            data = {"source": self.description, "files": dict(self.records), "missing": missing}
            data["complete"] = not missing
            if self.commit:
                data["commit"] = self.commit
            _write_json(self.path, data, indent=1, sort_keys=True)


def missing_record(file, have=()):
    return {"size": file.size, "sha256": file.sha256, "have": [list(byte_range) for byte_range in have]}


def record_kept(steps, dest, manifest):
    """Kept files enter the manifest with the hash planning found, unless it recorded them unchanged already."""
    for step in steps:
        if step.action != "keep":
            continue
        path = os.path.join(dest, step.file.path)
        if not recorded_unchanged(manifest.records.get(step.file.path), os.stat(path)):
            manifest.verified(step.file.path, path, step.sha256 or step.file.sha256)


def hash_mismatch(file, digest, again):
    what = "the file will be fetched once more" if again else "it was fetched twice; the source itself is bad"
    return f"{file.path}: SHA-256 {digest} differs from the source's {file.sha256}; {what}"


def remove_empty_directories(root):
    """Remove the empty directories under `root`, and `root` itself when it ends up empty."""
    for directory, _subdirectories, _names in os.walk(root, topdown=False):
        with contextlib.suppress(OSError):  # not empty
            os.rmdir(directory)


class _Stopped(Exception):
    """Another worker failed: this one stops at its next chunk."""


class _Part:
    """Bytes [pos, end) of one file that one worker fetches; `end` shrinks when another worker takes a half.

    `reading` is the end of the read in progress: those bytes are on their way and are never split off.
    """

    __slots__ = ("end", "job", "pos", "reading")

    def __init__(self, job, pos, end):
        self.job, self.pos, self.end = job, pos, end
        self.reading = pos


class _Job:
    """One file being fetched: its partial copy, the byte ranges it holds, and its SHA-256 up to `hashed`."""

    def __init__(self, step, dest):
        self.step = step
        self.file = step.file
        self.final = os.path.join(dest, step.file.path)
        self.partial = os.path.join(dest, PARTIAL_DIR, step.file.path)
        self.active = []
        self.fd = None
        self.opened = False
        self.refetched = False
        self.whole = False
        self.done = False
        self.hash_lock = threading.Lock()
        self.restart()
        if step.action == "resume":
            self.have = ByteRanges(step.have)
            self.pending = deque(_Part(self, start, end) for start, end in self.have.missing(self.file.size))

    def restart(self):
        """Start the file over: nothing held, nothing hashed, one range for all of it."""
        self.have = ByteRanges()
        self.pending = deque([_Part(self, 0, self.file.size)] if self.file.size else [])
        self.digest = hashlib.sha256()
        self.hashed = 0


class Fetcher:
    """Carries out the fetch and resume steps of one source into `dest`, `workers` connections at a time."""

    def __init__(self, source, dest, manifest, progress, workers, retries=None, retry_delay=None):
        self.source = source
        self.dest = dest
        self.manifest = manifest
        self.progress = progress
        self.workers = workers
        self.retries = RETRIES if retries is None else retries
        self.retry_delay = RETRY_DELAY if retry_delay is None else retry_delay
        self._jobs = []
        self._lock = threading.Lock()
        self._error = None
        self._flushed = 0.0

    # ---- the whole fetch ------------------------------------------------------------------------

    def run(self, steps):
        """Fetch; return the manifest's records. On failure the manifest says what is missing, then WeightsError."""
        record_kept(steps, self.dest, self.manifest)
        self._jobs = [_Job(step, self.dest) for step in steps if step.action != "keep"]
        self._write_manifest()
        threads = []
        try:
            for job in [job for job in self._jobs if not job.file.size]:
                self._open(job)
                self._finish(job)
            threads = [threading.Thread(target=self._work, daemon=True) for _worker in range(self.workers)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        except BaseException as error:
            self._fail(error)
            for thread in threads:  # they stop at their next read; only then may their files close
                thread.join()
        finally:
            self._close_all()
            self._write_manifest()
            remove_empty_directories(os.path.join(self.dest, PARTIAL_DIR))
        if self._error is None and self._jobs:
            self._error = WeightsError(f"the fetch ended with {self._jobs[0].file.path} unfinished")
        if self._error is not None:
            if isinstance(self._error, (WeightsError, OSError)):
                raise WeightsError(
                    f"{self._error}; {len(self._jobs)} of {len(steps)} files are missing, as {MANIFEST_NAME} "
                    "records with the bytes already there: run again to resume"
                ) from None
            raise self._error
        return self.manifest.records

    def _write_manifest(self):
        with self._lock:
            missing = {job.file.path: missing_record(job.file, job.have.ranges) for job in self._jobs}
        self.manifest.write(missing)
        self._flushed = time.monotonic()

    def _fail(self, error):
        with self._lock:
            if self._error is None:
                self._error = error

    def _close_all(self):
        for job in self._jobs:
            if job.fd is not None:
                os.close(job.fd)
                job.fd = None

    # ---- one worker -----------------------------------------------------------------------------

    def _work(self):
        buffer = memoryview(bytearray(READ_BYTES))
        try:
            while True:
                job, part = self._next()
                if job is None:
                    return
                if part is None:
                    self._hash(job)  # a resumed file that holds every byte already: only the hash is left
                    continue
                self._fetch_part(part, buffer)
        except _Stopped:
            return
        except BaseException as error:
            self._fail(error)

    def _next(self):
        """(job, part) to work on: a file nobody has started, a waiting range, half of the largest range in flight,
        or (job, None) for a file that only needs its hash; (None, None) when nothing is left."""
        with self._lock:
            if self._error is not None:
                return None, None
            job = next((job for job in self._jobs if job.pending and not job.active), None)
            job = job or next((job for job in self._jobs if job.pending), None)
            if job is not None:
                part = job.pending.popleft()
            else:
                part = self._split_largest()
                job = part.job if part is not None else None
            if job is None:
                job = next((job for job in self._jobs if not job.opened), None)
                if job is None:
                    return None, None
            if not job.opened:
                self._open(job)
            if part is not None:
                job.active.append(part)
            return job, part

    def _split_largest(self):
        parts = [part for job in self._jobs for part in job.active]
        if self.source.ranges is not True or not parts:
            return None  # only a source known to serve ranges gets a file over several connections
        largest = max(parts, key=lambda part: part.end - max(part.pos, part.reading))
        start = max(largest.pos, largest.reading)
        remaining = largest.end - start
        if remaining < 2 * SPLIT_BYTES:
            return None
        middle = start + remaining // 2
        if middle - middle % READ_BYTES > start:
            middle -= middle % READ_BYTES  # whole reads for both halves, where the halves are long enough
        taken = _Part(largest.job, middle, largest.end)
        largest.end = middle
        return taken

    def _open(self, job):
        """The partial copy, at its full size; a shorter copy at the file's place continues there."""
        os.makedirs(os.path.dirname(job.partial), exist_ok=True)
        resuming = job.have.covered() > 0
        if resuming and job.step.resume_from == "file":
            os.replace(job.final, job.partial)
        elif os.path.lexists(job.final):
            os.remove(job.final)  # a copy that is not the source's must not stay under its name
        job.fd = os.open(job.partial, os.O_RDWR | os.O_CREAT | (0 if resuming else os.O_TRUNC), 0o666)
        os.ftruncate(job.fd, job.file.size)
        job.opened = True
        self.progress.begin(job.file.path)

    def _fetch_part(self, part, buffer):
        job = part.job
        failures = 0
        while True:
            with self._lock:
                start, end = part.pos, part.end
            if start >= end:
                break
            try:
                with self.source.open_range(job.file.path, start, end) as stream:
                    self._copy(part, stream, buffer)
            except RangeIgnored:
                self._whole_file(job)
                break
            except SourceError as error:
                failures = 0 if part.pos > start else failures
                failures = self._retry(error, failures)
        with self._lock:
            job.active.remove(part)
        self._hash(job)

    def _retry(self, error, failures):
        """Count a failed request; pause before the next attempt, or raise when it may not be tried again."""
        failures += 1
        if not error.transient or failures > self.retries:
            raise error
        time.sleep(self.retry_delay * failures)
        return failures

    def _whole_file(self, job):
        """The source has no ranges: the file comes whole, from byte 0, over one connection (once)."""
        with job.hash_lock, self._lock:
            if job.whole:
                return
            job.whole = True
            self.progress.add_needed(job.have.covered())
            job.restart()

    def _copy(self, part, stream, buffer):
        """Read the part's bytes from `stream` into the partial copy, until the part ends (it may shrink)."""
        job = part.job
        while True:
            with self._lock:
                if self._error is not None:
                    raise _Stopped
                position, end = part.pos, part.end
                part.reading = min(position + READ_BYTES, end)
            if position >= end:
                return
            view = buffer[: part.reading - position]
            count = _read_into(stream, view, job.file.path, position)
            os.pwrite(job.fd, view[:count], position)
            with self._lock:
                part.pos = position + count
                job.have.add(position, position + count)
            self.progress.advance(count)
            self._hash(job, position, view[:count])
            if time.monotonic() - self._flushed >= MANIFEST_INTERVAL:
                self._write_manifest()

    # ---- hashing as the bytes land --------------------------------------------------------------

    def _hash(self, job, start=None, data=None):
        """Hash the file's bytes from `hashed` to the end of what has landed contiguously.

        `data` (bytes just written at `start`) is hashed from memory when it continues the prefix; the
        rest is read back. One thread hashes a file at a time; a thread that finds another hashing
        leaves the work to it, which looks again after it lets go.
        """
        while True:
            if not job.hash_lock.acquire(blocking=False):
                return
            try:
                with self._lock:
                    target = job.have.contiguous_end(job.hashed)
                if data is not None and start <= job.hashed < start + len(data) <= target:
                    job.digest.update(data[job.hashed - start :])
                    job.hashed = start + len(data)
                data = None
                while job.hashed < target:
                    chunk = os.pread(job.fd, min(READ_BYTES, target - job.hashed), job.hashed)
                    if not chunk:
                        raise WeightsError(f"{job.partial} is shorter than the bytes written to it")
                    job.digest.update(chunk)
                    job.hashed += len(chunk)
                with self._lock:
                    complete = self._complete(job)
                if complete:
                    self._finish(job)
                    return
            finally:
                job.hash_lock.release()
            # Work that another thread left while this one held the lock: bytes to hash, or the last range ended.
            with self._lock:
                again = job.have.contiguous_end(job.hashed) > job.hashed or self._complete(job)
            if not again:
                return

    @staticmethod
    def _complete(job):
        """Every byte hashed, no range in flight or waiting, and not finished yet (under the lock)."""
        return job.hashed == job.file.size and not job.active and not job.pending and not job.done

    def _finish(self, job):
        """The file's hash is complete: move it to its name and record it, or fetch it once more."""
        digest = job.digest.hexdigest()
        if job.file.sha256 and digest != job.file.sha256:
            if job.refetched or not job.file.size:
                os.remove(job.partial)
                with self._lock:
                    job.have = ByteRanges()
                raise WeightsError(hash_mismatch(job.file, digest, again=False) + ", and the copy was removed")
            self.progress.add_needed(job.file.size)
            with self._lock:
                job.refetched = True
                job.restart()
            return
        os.close(job.fd)
        job.fd = None
        os.replace(job.partial, job.final)
        self.manifest.verified(job.file.path, job.final, digest)
        with self._lock:
            job.done = True
            self._jobs.remove(job)
        self.progress.end(job.file.path)
        self._write_manifest()


def _read_into(stream, view, path, position):
    """Fill `view` from `stream`; fewer bytes only at the end of the response. Network failures are SourceError."""
    filled = 0
    try:
        while filled < len(view):
            count = stream.readinto(view[filled:])
            if not count:
                break
            filled += count
    except (OSError, http.client.HTTPException) as error:
        if not filled:
            raise SourceError(f"{path}: reading from byte {position} failed: {error}") from None
    if not filled:
        raise SourceError(f"{path}: the source closed the connection at byte {position}")
    return filled
