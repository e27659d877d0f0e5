# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model weights: what a source holds, what the host lacks, whether it fits, and where bytes come from.

A source lists files with their sizes (and SHA-256 where it knows them): the Hugging Face hub through
its model API, an HTTP mirror through a manifest or its directory listing, a shared path through the
filesystem. `plan_fetch` compares that list with the weights directory and its manifest, and says what
to keep, resume or fetch again and how many bytes that needs; `check_space` refuses before anything
is written when those bytes do not fit. Sources hand out byte ranges of a file (`open_range`); the
fetch itself, several files and ranges at once, is in `_weights_fetch`.
"""

from __future__ import annotations

import bisect
import fnmatch
import hashlib
import http.client
import json
import os
import posixpath
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from html.parser import HTMLParser

# Written into the weights directory: the verified files, and what is still missing. A mirror serving
# such a directory passes its sizes and hashes on to the hosts that fetch from it.
MANIFEST_NAME = ".llmops-weights.json"
# Files being fetched live here until their SHA-256 is checked, so that the directory never holds a
# file under its real name that is not whole.
PARTIAL_DIR = ".llmops-partial"
CHUNK_BYTES = 1 << 20
# The hub's address when neither the caller nor HF_ENDPOINT names one.
HUB_ENDPOINT = "https://huggingface.co"
# Git's rules for ref names (git check-ref-format), which the hub applies to branches and tags.
_REVISION_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//")
_REPO_PART = re.compile(r"[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9_])?\Z")


def hub_endpoint(explicit=None):
    """The hub's base URL: the one given, else the HF_ENDPOINT variable (as huggingface_hub reads it), else the hub."""
    return (explicit or os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT).rstrip("/")


class WeightsError(Exception):
    """A source that cannot be read, weights that do not fit, or a file that fails verification.

    `status` is the HTTP status when a server refused the request.
    """

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class SourceError(WeightsError):
    """A request to the source failed: a refusal (with `status`), or the network (no status)."""

    @property
    def transient(self):
        """Worth asking again: no answer, a cut connection, or a server that is busy or broken for now."""
        return self.status is None or self.status in (408, 429) or self.status >= 500


class RangeIgnored(WeightsError):
    """The server answered a request for bytes from N > 0 with the whole file: it has no ranges."""


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None = None


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


# ---- checks of what a user names ----------------------------------------------------------------


def repo_problem(repo):
    """Why `repo` is not a hub repository name (owner/name, as the hub accepts it), or None."""
    if not isinstance(repo, str) or not repo:
        return "it must be a repository name such as owner/name"
    parts = repo.split("/")
    if len(parts) > 2:
        return "it must be owner/name, with one slash"
    if "--" in repo or ".." in repo:
        return "it must not contain '--' or '..' (the hub refuses them, and '..' would climb out of a mirror)"
    if len(parts[-1]) > 96 or not all(_REPO_PART.match(part) for part in parts):
        return "each part must be letters, digits, '-', '_' or '.', start with a letter or digit, not end in '-' or '.'"
    return None


def revision_problem(revision):
    """Why `revision` is not a branch, tag or commit the hub accepts (git's ref rules), or None."""
    if not isinstance(revision, str) or not revision:
        return "it must be a branch, tag or commit hash"
    if len(revision) > 255:
        return "it is longer than 255 characters"
    found = _REVISION_FORBIDDEN.search(revision)
    if found:
        return f"it contains {found.group(0)!r}, which no branch, tag or commit may contain"
    parts = revision.split("/")
    if revision == "@" or revision.endswith(".") or "" in parts:
        return "it must not be '@', end with '.', or start or end with '/'"
    if any(part.startswith(".") or part.endswith(".lock") for part in parts):
        return "no part of it may start with '.' or end with '.lock'"
    return None


# ---- file lists -----------------------------------------------------------------------------------


def safe_relative_path(path):
    """A source's file name as a relative path inside the weights directory, or WeightsError."""
    normal = posixpath.normpath(path) if path else ""
    if not normal or normal.startswith(("/", "../")) or normal in (".", "..") or normal == MANIFEST_NAME:
        raise WeightsError(f"the source lists a file outside the weights directory: {path!r}")
    if normal.split("/", 1)[0] == PARTIAL_DIR:
        raise WeightsError(f"the source lists a file in {PARTIAL_DIR}/, where fetches keep unfinished files: {path!r}")
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


def manifest_files(manifest, where):
    """The files a manifest records, or WeightsError when it says that files are still missing there.

    A directory whose fetch was interrupted is not a source: hosts fetching from it would get a half model.
    """
    missing = sorted(manifest.get("missing") or {})
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise WeightsError(
            f"the copy at {where} is incomplete: its manifest lists {len(missing)} missing files ({shown}). "
            "Finish the fetch there (run the deploy on that host again) before other hosts fetch from it."
        )
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
            manifest = json.load(handle)
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


# ---- byte ranges ----------------------------------------------------------------------------------


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


# ---- sources --------------------------------------------------------------------------------------


class _NoCredentialsOnRedirect(urllib.request.HTTPRedirectHandler):
    """The hub redirects downloads to a CDN: the token must not follow to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


def _content_range_start(value):
    """The first byte of a `Content-Range: bytes START-END/SIZE` header, or None."""
    match = re.match(r"bytes (\d+)-\d+/(?:\d+|\*)\Z", value or "")
    return int(match.group(1)) if match else None


class HttpSource:
    """Files under a base URL: the hub's resolve URLs or an HTTP mirror's directory.

    `headers` (the hub's token) go only to the base URL's host. Where a file's URL redirects (the hub
    sends downloads to its CDN), the address it landed on is used for the file's other ranges. `ranges`
    becomes True or False once the server has answered a Range request (206, or 200 with everything).
    """

    def __init__(self, base_url, headers=None, timeout=60):
        self.base_url = base_url.rstrip("/") + "/"
        self.headers = dict(headers or {})
        self.timeout = timeout
        self.ranges = None
        self._opener = urllib.request.build_opener(_NoCredentialsOnRedirect)
        self._located = {}

    def url(self, path):
        return urllib.parse.urljoin(self.base_url, urllib.parse.quote(path))

    def request(self, url, method="GET", headers=None):
        same_host = urllib.parse.urlsplit(url).netloc == urllib.parse.urlsplit(self.base_url).netloc
        sent = {**(self.headers if same_host else {}), **(headers or {})}
        request = urllib.request.Request(url, method=method, headers=sent)
        try:
            return self._opener.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as error:
            raise SourceError(f"{method} {url} answered HTTP {error.code} {error.reason}", error.code) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            raise SourceError(f"{method} {url} failed: {getattr(error, 'reason', error)}") from None

    def read_json(self, url):
        with self.request(url) as response:
            try:
                return json.load(response)
            except ValueError as error:
                raise WeightsError(f"{url} did not return JSON: {error}") from None

    def open_range(self, path, start=0, end=None):
        """A response with the bytes of `path` from `start` (to `end`, or to its end).

        A server that ignores Range answers 200 with the whole file, which serves a range from 0; from
        any other byte it is RangeIgnored. An address the file redirected to that stops working (a
        signed CDN URL that expired) is given up for the file's own URL once.
        """
        located = self._located.get(path)
        try:
            return self._open_at(located or self.url(path), path, start, end)
        except SourceError as error:
            if located is None or error.status is None or error.status >= 500:
                raise
            self._located.pop(path, None)
            return self._open_at(self.url(path), path, start, end)

    def _open_at(self, url, path, start, end):
        headers = {}
        if start or end is not None:
            headers["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        response = self.request(url, headers=headers)
        if response.geturl() != url:
            self._located[path] = response.geturl()
        if headers:
            self.ranges = response.status == 206
        if response.status == 206 and _content_range_start(response.headers.get("Content-Range")) != start:
            response.close()
            raise SourceError(f"{url} answered bytes {response.headers.get('Content-Range')} to a request from {start}")
        if response.status != 206 and start:
            response.close()
            raise RangeIgnored(f"GET {url} ignored the Range request from byte {start}")
        return response


class MirrorHttpSource(HttpSource):
    """A weights directory served over HTTP: its manifest when it has one, else its listing and HEAD."""

    def files(self):
        try:
            manifest = self.read_json(self.url(MANIFEST_NAME))
        except WeightsError:
            return self._listed_files()
        return manifest_files(manifest, self.base_url)

    def _listed_files(self):
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

    ranges = True

    def __init__(self, root):
        self.root = root

    def files(self):
        if not os.path.isdir(self.root):
            raise WeightsError(f"the mirror directory {self.root} does not exist on this host")
        recorded = {file.path: file for file in manifest_files(read_manifest(self.root), self.root)}
        return [recorded.get(file.path, file) for file in local_files(self.root)]

    def open_range(self, path, start=0, end=None):
        handle = open(os.path.join(self.root, path), "rb")  # noqa: SIM115 - returned to the caller, who closes it
        handle.seek(start)
        return handle


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
        with source.open_range(path) as stream:
            return json.load(stream)
    except OSError as error:
        raise WeightsError(f"cannot read {path}: {error}") from None
    except ValueError as error:
        raise WeightsError(f"{path} is not JSON: {error}") from None


def disk_usage_free(path):
    return shutil.disk_usage(nearest_existing_directory(path)).free
