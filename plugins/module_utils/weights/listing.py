# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What weights there are: the files a source or a weights directory holds, and the names a user gives them.

A list is RemoteFile entries (path, size, SHA-256 where known): from the hub's model info, from a
mirror's manifest or its HTTP directory listing, from a directory on disk. The checks of a hub
repository name and a revision say why one is refused, before anything is asked of the hub.
"""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import re
import urllib.parse
from dataclasses import dataclass
from html.parser import HTMLParser

# Written into the weights directory: the verified files, and what is still missing. A mirror serving
# such a directory passes its sizes and hashes on to the hosts that fetch from it.
MANIFEST_NAME = ".llmops-weights.json"
# Files being fetched live here until their SHA-256 is checked, so that the directory never holds a
# file under its real name that is not whole.
PARTIAL_DIR = ".llmops-partial"
# Git's rules for ref names (git check-ref-format), which the hub applies to branches and tags.
_REVISION_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//")
_REPO_PART = re.compile(r"[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9_])?\Z")


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
