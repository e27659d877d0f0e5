# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where weights come from: the Hugging Face hub, an HTTP mirror, or a path the host mounts.

Each source lists its files and hands out byte ranges of a file (`open_range`); `open_source` picks the
source of a hub repository, and `read_source_json` reads one small file (config.json) before any weights.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request

from ansible_collections.llmops.vllm.plugins.module_utils.weights.listing import (
    MANIFEST_NAME,
    RemoteFile,
    WeightsError,
    hub_files,
    listing_links,
    local_files,
    manifest_files,
    read_manifest,
    safe_relative_path,
)

# The hub's address when neither the caller nor HF_ENDPOINT names one.
HUB_ENDPOINT = "https://huggingface.co"


def hub_endpoint(explicit=None):
    """The hub's base URL: the one given, else the HF_ENDPOINT variable (as huggingface_hub reads it), else the hub."""
    return (explicit or os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT).rstrip("/")


class SourceError(WeightsError):
    """A request to the source failed: a refusal (with `status`), or the network (no status)."""

    @property
    def transient(self):
        """Worth asking again: no answer, a cut connection, or a server that is busy or broken for now."""
        return self.status is None or self.status in (408, 429) or self.status >= 500


class RangeIgnored(WeightsError):
    """The server answered a request for bytes from N > 0 with the whole file: it has no ranges."""


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
