# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The hub through huggingface_hub, where the target's Python has it (vLLM's venv does: vLLM depends on it).

The library knows the hub's own ways that the collection's fetch does not: Xet storage (hf_xet chunks
and deduplicates the files of most large repositories on the hub today), its retries, proxies and
certificates. It lists the files with their sizes and SHA-256 (`HfApi.model_info(files_metadata=True)`)
for the disk check, and fetches each file with `hf_hub_download(local_dir=...)`, several at once (the
parts `snapshot_download` is made of). Each file is hashed by the worker that fetched it as soon as
it is there, while the others still download, and recorded in the manifest with the hub's hash.

The library fetches whole files: it resumes a file within one run, not after the process ended, so
partial copies of the collection's own fetch are dropped here.
"""

from __future__ import annotations

import glob
import importlib
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed

from ansible_collections.llmops.vllm.plugins.module_utils.weights.fetch import (
    hash_mismatch,
    missing_record,
    record_kept,
)
from ansible_collections.llmops.vllm.plugins.module_utils.weights.listing import (
    MANIFEST_NAME,
    PARTIAL_DIR,
    RemoteFile,
    WeightsError,
    safe_relative_path,
)
from ansible_collections.llmops.vllm.plugins.module_utils.weights.plan import sha256_of

CLIENTS = ("auto", "huggingface_hub", "builtin")


def choose_client(requested, mirror):
    """(huggingface_hub module or None, a description of the client that fetches and why).

    A mirror is always fetched by the collection's own code; so is the hub when the library is missing,
    unless `requested` is huggingface_hub, which then fails.
    """
    python = sys.executable
    if mirror:
        return None, {"name": "builtin", "python": python, "reason": "the source is a mirror, not the hub"}
    if requested == "builtin":
        return None, {"name": "builtin", "python": python, "reason": "hub_client=builtin"}
    try:
        library = importlib.import_module("huggingface_hub")
    except ImportError as error:
        reason = f"{python} cannot import huggingface_hub ({error})"
        if requested == "huggingface_hub":
            raise WeightsError(f"hub_client=huggingface_hub, but {reason}") from None
        return None, {"name": "builtin", "python": python, "reason": reason}
    version = getattr(library, "__version__", "unknown")
    reason = f"{python} has huggingface_hub {version}"
    return library, {"name": "huggingface_hub", "python": python, "version": version, "reason": reason}


def _library_error(error, what):
    """The library's exception as WeightsError, with the HTTP status when there was one."""
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    message = " ".join(str(error).split()) or type(error).__name__
    return WeightsError(f"{what}: {type(error).__name__}: {message}", status if isinstance(status, int) else None)


class LibrarySource:
    """A model repository at one revision, listed through huggingface_hub."""

    def __init__(self, library, repo, revision, endpoint, token=None, timeout=60):
        self.library = library
        self.repo = repo
        self.revision = revision
        self.endpoint = endpoint
        # False, not None: the one token is the collection's setting, never one the library finds on the host.
        self.token = token or False
        self.timeout = timeout
        self.commit = None

    def files(self):
        api = self.library.HfApi(endpoint=self.endpoint, token=self.token)
        try:
            info = api.model_info(self.repo, revision=self.revision, files_metadata=True, timeout=self.timeout)
        except Exception as error:  # the library raises its own HTTP and network errors
            raise _library_error(error, f"huggingface_hub could not list {self.repo} at {self.revision}") from None
        self.commit = info.sha
        files = []
        for sibling in info.siblings or []:
            if sibling.size is None:
                raise WeightsError(f"the hub gave no size for {sibling.rfilename!r}")
            sha256 = (sibling.lfs or {}).get("sha256")
            files.append(RemoteFile(safe_relative_path(sibling.rfilename), int(sibling.size), sha256))
        return files


class _ProgressBar:
    """The part of tqdm that huggingface_hub's downloads call, counting their bytes into a Progress."""

    progress = None

    def __init__(self, *args, **kwargs):
        self.total = kwargs.get("total")
        self.n = kwargs.get("initial") or 0

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False

    def update(self, count=1):
        if count:
            self.n += count
            self.progress.advance(count)

    def close(self, *args, **kwargs):
        pass

    refresh = set_description = set_description_str = set_postfix = set_postfix_str = reset = clear = close


def _drop_stale_copies(steps, dest):
    """What an earlier fetch left unfinished: the library's temporary files (unique to a process, never
    resumed) and the collection's partial copies of the files the library now fetches whole."""
    downloads = os.path.join(dest, ".cache", "huggingface", "download")
    for leftover in glob.glob(os.path.join(downloads, "**", "*.incomplete"), recursive=True):
        os.remove(leftover)
    for step in steps:
        partial = os.path.join(dest, PARTIAL_DIR, step.file.path)
        if os.path.lexists(partial):
            os.remove(partial)


def fetch_with_library(source, steps, dest, manifest, progress, workers):
    """Fetch the steps' files with hf_hub_download, `workers` at a time, each hashed as soon as it is there."""
    record_kept(steps, dest, manifest)
    jobs = [step for step in steps if step.action != "keep"]
    _drop_stale_copies(jobs, dest)
    missing = {step.file.path: missing_record(step.file) for step in jobs}
    lock = threading.Lock()
    manifest.write(dict(missing))
    progress_bar = type("ProgressBar", (_ProgressBar,), {"progress": progress})

    def fetch_one(file):
        progress.begin(file.path)
        path = os.path.join(dest, file.path)
        for attempt in (1, 2):
            try:
                source.library.hf_hub_download(
                    source.repo,
                    file.path,
                    revision=source.commit or source.revision,
                    local_dir=dest,
                    endpoint=source.endpoint,
                    token=source.token,
                    force_download=True,
                    etag_timeout=source.timeout,
                    tqdm_class=progress_bar,
                )
            except Exception as error:  # the library raises its own HTTP and network errors
                raise _library_error(error, f"huggingface_hub could not fetch {file.path}") from None
            size = os.path.getsize(path)
            if size != file.size:
                os.remove(path)
                raise WeightsError(f"{file.path}: got {size} bytes, the hub lists {file.size}; the copy was removed")
            digest = sha256_of(path).hexdigest()
            if not file.sha256 or digest == file.sha256:
                break
            if attempt == 2:
                os.remove(path)
                raise WeightsError(hash_mismatch(file, digest, again=False) + ", and the copy was removed")
            progress.add_needed(file.size)
        manifest.verified(file.path, path, digest)
        with lock:
            missing.pop(file.path)
            manifest.write(dict(missing))
        progress.end(file.path)

    first_error = None
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(fetch_one, step.file) for step in jobs]
        for future in as_completed(futures):
            if future.cancelled():
                continue
            if future.exception() is not None and first_error is None:
                first_error = future.exception()
                for other in futures:
                    other.cancel()
    if first_error is not None:
        raise WeightsError(
            f"{first_error}; {len(missing)} of {len(steps)} files are missing, as {MANIFEST_NAME} records: "
            "run again to fetch them"
        ) from None
    return manifest.records
