# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model weights: what a source holds, what the host lacks, whether it fits, and the fetch itself.

A source lists files with their sizes (and SHA-256 where it knows them): the Hugging Face hub through
its model API, an HTTP mirror through a manifest or its directory listing, a shared path through the
filesystem. `plan_fetch` compares that list with the weights directory and its manifest, and says what
to keep, resume or fetch again and how many bytes that needs; `check_space` refuses before anything
is written when those bytes do not fit. Fetching resumes a shorter file from where it stopped (an HTTP
Range request, or a seek on a shared path) and checks each file's size and hash as it is written.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import posixpath
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser

# Written into the weights directory after each verified file; a mirror serving such a directory
# passes its sizes and hashes on to the hosts that fetch from it.
MANIFEST_NAME = ".llmops-weights.json"
CHUNK_BYTES = 1 << 20
HUB_ENDPOINT = "https://huggingface.co"


class WeightsError(Exception):
    """A source that cannot be read, weights that do not fit, or a file that fails verification.

    `status` is the HTTP status when a server refused the request.
    """

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None = None


@dataclass(frozen=True)
class Step:
    """What to do with one file: keep it, resume it from `offset`, or fetch it whole (offset 0)."""

    file: RemoteFile
    action: str
    offset: int = 0
    reason: str = ""

    @property
    def bytes_needed(self):
        return 0 if self.action == "keep" else self.file.size - self.offset


# ---- file lists -----------------------------------------------------------------------------------


def safe_relative_path(path):
    """A source's file name as a relative path inside the weights directory, or WeightsError."""
    normal = posixpath.normpath(path)
    if not path or normal.startswith(("/", "../")) or normal in (".", "..") or normal == MANIFEST_NAME:
        raise WeightsError(f"the source lists a file outside the weights directory: {path!r}")
    return normal


def select_files(files, allow_patterns):
    """Files matching any of the patterns (the hub's semantics: fnmatch, and 'dir/' means 'dir/*')."""
    if not allow_patterns:
        return list(files)
    patterns = [pattern + "*" if pattern.endswith("/") else pattern for pattern in allow_patterns]
    return [file for file in files if any(fnmatch.fnmatch(file.path, pattern) for pattern in patterns)]


def hub_files(model_info):
    """Files of a hub model info with file metadata (GET /api/models/REPO/revision/REV?blobs=true).

    Each sibling has `rfilename` and `size`; files stored in LFS add `lfs.sha256`. This is the JSON
    behind huggingface_hub's `HfApi.model_info(..., files_metadata=True)`.
    """
    files = []
    for sibling in model_info.get("siblings") or []:
        if sibling.get("size") is None:
            raise WeightsError(f"the hub gave no size for {sibling.get('rfilename')!r} (ask for blobs=true)")
        lfs = sibling.get("lfs") or {}
        files.append(RemoteFile(safe_relative_path(sibling["rfilename"]), int(sibling["size"]), lfs.get("sha256")))
    return files


def manifest_files(manifest):
    return [
        RemoteFile(safe_relative_path(path), int(record["size"]), record.get("sha256"))
        for path, record in sorted(manifest.get("files", {}).items())
    ]


class _LinkParser(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.links.extend(value for name, value in attrs if name == "href" and value)


def listing_links(html):
    """Entries of an HTTP directory listing (nginx autoindex, Apache, python -m http.server).

    Returns relative names, directories ending in '/', without the parent, sort links and hidden files.
    """
    parser = _LinkParser()
    parser.feed(html)
    entries = []
    for href in parser.links:
        parts = urllib.parse.urlsplit(href)
        if parts.scheme or parts.netloc or parts.query or parts.path.startswith("/"):
            continue
        name = urllib.parse.unquote(parts.path)
        if name in ("", "./", "../") or name.startswith(".") or name in entries:
            continue
        entries.append(name)
    return entries


def local_files(root):
    """Files under a directory (a shared path, or the weights directory itself) with their sizes."""
    files = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = sorted(name for name in subdirectories if not name.startswith("."))
        for name in sorted(names):
            full = os.path.join(directory, name)
            relative = os.path.relpath(full, root).replace(os.sep, "/")
            if not name.startswith(".") and os.path.isfile(full):
                files.append(RemoteFile(relative, os.path.getsize(full)))
    return files


def read_manifest(directory):
    try:
        with open(os.path.join(directory, MANIFEST_NAME), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


# ---- planning -------------------------------------------------------------------------------------


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


def _recorded_unchanged(record, stat):
    return bool(record) and record.get("size") == stat.st_size and record.get("mtime_ns") == stat.st_mtime_ns


def plan_step(file, dest, record, same_source=True):
    """Compare one source file with its local copy and the manifest's record of that copy.

    A shorter copy is resumed; a longer one is fetched again. A copy of the right size is kept when the
    manifest saw it unchanged (same size and mtime) with the expected hash; otherwise it is hashed and
    compared with the source's hash, or with the hash the manifest recorded when the source has none.
    A copy with no hash to check is trusted for its size only when the manifest names the same source.
    """
    path = os.path.join(dest, file.path)
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return Step(file, "fetch", reason="missing")
    if stat.st_size < file.size:
        return Step(file, "resume", offset=stat.st_size, reason=f"partial: {stat.st_size} of {file.size} bytes")
    if stat.st_size > file.size:
        return Step(file, "fetch", reason=f"corrupt: {stat.st_size} bytes, the source has {file.size}")
    expected = file.sha256 or (record or {}).get("sha256")
    if expected is None and not same_source:
        return Step(file, "fetch", reason="no hash to compare, and the directory's manifest names another source")
    if expected is None:
        return Step(file, "keep", reason="size matches (no hash known)")
    if _recorded_unchanged(record, stat) and record.get("sha256") == expected:
        return Step(file, "keep", reason="verified before, unchanged")
    if sha256_of(path).hexdigest() != expected:
        return Step(file, "fetch", reason="corrupt: SHA-256 differs")
    return Step(file, "keep", reason="SHA-256 matches")


def plan_fetch(files, dest, source_description):
    """One step per file; the manifest's records count only when it names the same source."""
    manifest = read_manifest(dest)
    same_source = manifest.get("source") == source_description
    records = manifest.get("files", {}) if same_source else {}
    return [plan_step(file, dest, records.get(file.path), same_source) for file in files]


def nearest_existing_directory(path):
    """The directory whose filesystem will hold `path`: itself, or its closest existing parent."""
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


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


# ---- sources --------------------------------------------------------------------------------------


class _NoCredentialsOnRedirect(urllib.request.HTTPRedirectHandler):
    """The hub redirects downloads to a CDN: the token must not follow to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


class HttpSource:
    """Files under a base URL: the hub's resolve URLs or an HTTP mirror's directory."""

    def __init__(self, base_url, headers=None, timeout=60):
        self.base_url = base_url.rstrip("/") + "/"
        self.headers = dict(headers or {})
        self.timeout = timeout
        self._opener = urllib.request.build_opener(_NoCredentialsOnRedirect)

    def url(self, path):
        return urllib.parse.urljoin(self.base_url, urllib.parse.quote(path))

    def request(self, url, method="GET", headers=None):
        request = urllib.request.Request(url, method=method, headers={**self.headers, **(headers or {})})
        try:
            return self._opener.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as error:
            raise WeightsError(f"{method} {url} answered HTTP {error.code} {error.reason}", error.code) from None
        except (urllib.error.URLError, OSError) as error:
            raise WeightsError(f"{method} {url} failed: {getattr(error, 'reason', error)}") from None

    def read_json(self, url):
        with self.request(url) as response:
            try:
                return json.load(response)
            except ValueError as error:
                raise WeightsError(f"{url} did not return JSON: {error}") from None

    def open(self, path, offset):
        """A response for `path` from byte `offset`, and the offset it really starts at.

        A server that ignores Range answers 200 with the whole file: the copy then starts over.
        """
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        response = self.request(self.url(path), headers=headers)
        return response, offset if response.status == 206 else 0


class MirrorHttpSource(HttpSource):
    """A weights directory served over HTTP: its manifest when it has one, else its listing and HEAD."""

    def files(self):
        try:
            return manifest_files(self.read_json(self.url(MANIFEST_NAME)))
        except WeightsError:
            pass
        files = []
        directories = [""]
        while directories:
            directory = directories.pop(0)
            with self.request(self.url(directory)) as response:
                html = response.read().decode("utf-8", "replace")
            for name in listing_links(html):
                path = safe_relative_path(directory + name) + ("/" if name.endswith("/") else "")
                if name.endswith("/"):
                    directories.append(path)
                    continue
                with self.request(self.url(path), method="HEAD") as response:
                    length = response.headers.get("Content-Length")
                if length is None:
                    raise WeightsError(f"the mirror gave no Content-Length for {self.url(path)}")
                files.append(RemoteFile(path, int(length)))
        return files


class HubSource(HttpSource):
    """A model repository at one revision on the Hugging Face hub (or a hub-compatible endpoint)."""

    def __init__(self, repo, revision, endpoint=HUB_ENDPOINT, token=None, timeout=60):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        endpoint = endpoint.rstrip("/")
        quoted = urllib.parse.quote(revision, safe="")
        super().__init__(f"{endpoint}/{repo}/resolve/{quoted}/", headers, timeout)
        self.repo_url = f"{endpoint}/{repo}"
        self.info_url = f"{endpoint}/api/models/{repo}/revision/{quoted}?blobs=true"
        self.commit = None

    def files(self):
        """The files at the revision; later downloads come from the commit it resolved to, not a moving branch."""
        info = self.read_json(self.info_url)
        self.commit = info.get("sha")
        if self.commit:
            self.base_url = f"{self.repo_url}/resolve/{self.commit}/"
        return hub_files(info)


class PathSource:
    """A weights directory on a filesystem the host mounts (NFS, a shared disk, an rsync target)."""

    def __init__(self, root):
        self.root = root

    def files(self):
        if not os.path.isdir(self.root):
            raise WeightsError(f"the mirror directory {self.root} does not exist on this host")
        recorded = {file.path: file for file in manifest_files(read_manifest(self.root))}
        return [recorded.get(file.path, file) for file in local_files(self.root)]

    def open(self, path, offset):
        handle = open(os.path.join(self.root, path), "rb")  # noqa: SIM115 - returned to the caller, who closes it
        handle.seek(offset)
        return handle, offset


def open_source(repo, revision, mirror=None, hub_endpoint=HUB_ENDPOINT, hub_token=None, timeout=60):
    """Where the files of hub repository `repo` come from: MIRROR/owner/name when a mirror is set (an HTTP
    directory or a path the host mounts), else the hub."""
    if mirror:
        base = mirror.rstrip("/") + "/" + repo
        if base.startswith(("http://", "https://")):
            return MirrorHttpSource(base, timeout=timeout)
        return PathSource(base)
    return HubSource(repo, revision, hub_endpoint, hub_token, timeout)


def read_source_json(source, path):
    """One JSON file of a source, such as config.json before any weights are fetched."""
    try:
        stream, _offset = source.open(path, 0)
        with stream:
            return json.load(stream)
    except OSError as error:
        raise WeightsError(f"cannot read {path}: {error}") from None
    except ValueError as error:
        raise WeightsError(f"{path} is not JSON: {error}") from None


# ---- fetching -------------------------------------------------------------------------------------


class Progress:
    """Bytes done of bytes needed, written at most once per `interval` seconds to a JSON file."""

    def __init__(self, path, needed, interval=1.0, clock=time.monotonic):
        self.path = path
        self.needed = needed
        self.done = 0
        self.interval = interval
        self.clock = clock
        self.started = clock()
        self.last_write = None
        self.file = None

    def advance(self, count, file=None):
        self.done += count
        self.file = file or self.file
        now = self.clock()
        if self.path and (self.last_write is None or now - self.last_write >= self.interval):
            self.last_write = now
            self.write(now)

    def snapshot(self, now=None):
        elapsed = (self.clock() if now is None else now) - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        remaining = self.needed - self.done
        return {
            "done_bytes": self.done,
            "needed_bytes": self.needed,
            "percent": round(100.0 * self.done / self.needed, 1) if self.needed else 100.0,
            "bytes_per_second": round(rate),
            "eta_seconds": round(remaining / rate) if rate > 0 else None,
            "elapsed_seconds": round(elapsed, 3),
            "file": self.file,
        }

    def remove(self):
        """The fetch is over: the job's result says the rest."""
        if self.path and os.path.exists(self.path):
            os.remove(self.path)

    def write(self, now=None):
        directory = os.path.dirname(self.path) or "."
        with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, encoding="utf-8") as handle:
            json.dump(self.snapshot(now), handle)
        os.replace(handle.name, self.path)


def write_manifest(dest, source_description, records):
    path = os.path.join(dest, MANIFEST_NAME)
    with tempfile.NamedTemporaryFile("w", dir=dest, delete=False, encoding="utf-8") as handle:
        json.dump({"source": source_description, "files": records}, handle, indent=1, sort_keys=True)
    os.replace(handle.name, path)


def fetch_step(source, step, dest, progress):
    """Write one file from its step's offset; return its SHA-256, or WeightsError if it is not the source's."""
    path = os.path.join(dest, step.file.path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    stream, offset = source.open(step.file.path, step.offset)
    with stream, open(path, "r+b" if offset else "wb") as handle:
        digest = sha256_of(path, offset) if offset else hashlib.sha256()
        handle.truncate(offset)
        handle.seek(offset)
        progress.needed += step.offset - offset  # the server ignored Range: the file starts over
        while True:
            chunk = stream.read(CHUNK_BYTES)
            if not chunk:
                break
            handle.write(chunk)
            digest.update(chunk)
            progress.advance(len(chunk), step.file.path)
    size = os.path.getsize(path)
    if size != step.file.size:
        raise WeightsError(
            f"{step.file.path}: got {size} bytes, the source lists {step.file.size}; run again to resume"
        )
    if step.file.sha256 and digest.hexdigest() != step.file.sha256:
        os.remove(path)
        raise WeightsError(
            f"{step.file.path}: SHA-256 {digest.hexdigest()} differs from the source's {step.file.sha256}; "
            "the file was removed, run again to fetch it anew"
        )
    return digest.hexdigest()


def fetch(source, steps, dest, source_description, progress):
    """Carry out the steps, recording each verified file in the manifest as soon as it is complete."""
    os.makedirs(dest, exist_ok=True)
    manifest = read_manifest(dest)
    wanted = {step.file.path for step in steps}
    records = manifest.get("files", {}) if manifest.get("source") == source_description else {}
    records = {path: record for path, record in records.items() if path in wanted}
    for step in steps:
        path = os.path.join(dest, step.file.path)
        if step.action == "keep" and _recorded_unchanged(records.get(step.file.path), os.stat(path)):
            continue
        if step.action == "keep":
            sha256 = step.file.sha256 or sha256_of(path).hexdigest()
        else:
            sha256 = fetch_step(source, step, dest, progress)
        stat = os.stat(path)
        records[step.file.path] = {"size": stat.st_size, "sha256": sha256, "mtime_ns": stat.st_mtime_ns}
        write_manifest(dest, source_description, records)
    return records


def disk_usage_free(path):
    return shutil.disk_usage(nearest_existing_directory(path)).free
