"""A Hugging Face hub stand-in on loopback that answers as the hub does, for tests and benchmarks.

It serves the repositories under a directory (ROOT/owner/name/...) at one commit each:

- GET /api/models/REPO/revision/REV[?blobs=true]: the model info, `sha` and `siblings` with sizes, blob
  ids and, for files stored in LFS, `lfs.sha256`;
- GET /api/models/REPO/tree/REV: the file tree (what huggingface_hub's snapshot_download lists);
- HEAD/GET /REPO/resolve/REV/PATH: small files directly (ETag: the git blob id); LFS files with a 302 to
  the CDN, carrying X-Repo-Commit, X-Linked-Etag (the SHA-256) and X-Linked-Size as the hub does;
- HEAD/GET CDN/cdn/SHA256: the bytes, on another port (another origin, as the hub's CDN is another
  host), honouring `Range: bytes=A-B`.

A token makes the hub (not the CDN) answer 401 without `Authorization: Bearer TOKEN`. `fail(...)` makes
the next answers for a file go wrong: cut the connection mid-file, send other bytes, or an HTTP error.
Every request is logged. Standard library only: `python3 hub_standin.py ROOT` runs it on a host.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import socket
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".model")
LFS_MIN_BYTES = 10 << 20
MANIFEST_NAME = ".llmops-weights.json"


def file_hash(path, digest):
    """`digest` (a hashlib object, maybe fed a header already) of the file's bytes, in hex."""
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def git_blob_id(path):
    return file_hash(path, hashlib.sha1(f"blob {os.path.getsize(path)}\0".encode()))  # git's own blob id


class Repo:
    """One repository: its files (relative path -> metadata) at one commit."""

    def __init__(self, name, root, commit=None, branches=("main",)):
        self.name = name
        self.root = root
        self.commit = commit or hashlib.sha1(name.encode()).hexdigest()  # a stand-in commit id
        self.branches = set(branches)
        recorded = {}
        manifest = os.path.join(root, MANIFEST_NAME)
        if os.path.exists(manifest):  # a benchmark's large files: their hashes are known already
            with open(manifest, encoding="utf-8") as handle:
                recorded = json.load(handle).get("files", {})
        self.files = {}
        for directory, subdirectories, names in os.walk(root):
            subdirectories[:] = sorted(name for name in subdirectories if not name.startswith("."))
            for file_name in sorted(names):
                if file_name.startswith("."):
                    continue
                full = os.path.join(directory, file_name)
                relative = os.path.relpath(full, root).replace(os.sep, "/")
                size = os.path.getsize(full)
                lfs = file_name.endswith(LFS_SUFFIXES) or size >= LFS_MIN_BYTES
                sha256 = (recorded.get(relative) or {}).get("sha256") if lfs else None
                if lfs and not sha256:
                    sha256 = file_hash(full, hashlib.sha256())
                blob = hashlib.sha1(relative.encode()).hexdigest() if lfs else git_blob_id(full)
                self.files[relative] = {"full": full, "size": size, "sha256": sha256 if lfs else None, "blob": blob}

    def resolve(self, revision):
        return self.commit if revision == self.commit or revision in self.branches else None

    def siblings(self):
        return [
            {"rfilename": path, "size": meta["size"], "blobId": meta["blob"]}
            | ({"lfs": {"sha256": meta["sha256"], "size": meta["size"], "pointerSize": 134}} if meta["sha256"] else {})
            for path, meta in self.files.items()
        ]

    def tree(self):
        return [
            {"type": "file", "oid": meta["blob"], "size": meta["size"], "path": path}
            | ({"lfs": {"oid": meta["sha256"], "size": meta["size"], "pointerSize": 134}} if meta["sha256"] else {})
            for path, meta in self.files.items()
        ]


class HubStandIn:
    """The stand-in: `endpoint` (the hub) and `cdn` (where LFS downloads are redirected), both on 127.0.0.1."""

    def __init__(self, root, token=None, host="127.0.0.1", port=0, cdn_port=0):
        self.root = root
        self.token = token
        self.repos = {}
        self.requests = []
        self.sent = {}
        self.ignore_ranges = False
        self.in_flight = self.most_in_flight = 0
        self._faults = {}
        self._lock = threading.Lock()
        self._hub = _Server((host, port), _Handler, self, "hub")
        self._cdn = _Server((host, cdn_port), _Handler, self, "cdn")
        self.endpoint = f"http://{host}:{self._hub.server_address[1]}"
        self.cdn = f"http://{host}:{self._cdn.server_address[1]}"
        self._threads = [
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            for server in (self._hub, self._cdn)
        ]

    def put(self, repo, files):
        """Write `files` ({path: bytes}) into repository `repo` (owner/name) and serve it."""
        for path, data in files.items():
            target = os.path.join(self.root, repo, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as handle:
                handle.write(data)
        return self.add_repo(repo)

    def add_repo(self, name, commit=None, branches=("main",)):
        """Serve ROOT/NAME as repository NAME (owner/name); files are read when it is added."""
        self.repos[name] = Repo(name, os.path.join(self.root, name), commit, branches)
        return self.repos[name]

    def start(self):
        for thread in self._threads:
            thread.start()
        return self

    def stop(self):
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()

    def fail(self, path, kind, count=1, after=0, status=500):
        """The next `count` answers with bytes of `path` go wrong: `cut` closes the connection after
        `after` bytes of the body, `corrupt` sends other bytes of the same length, `status` answers `status`."""
        with self._lock:
            self._faults.setdefault(path, []).extend([{"kind": kind, "after": after, "status": status}] * count)

    def take_fault(self, path):
        with self._lock:
            faults = self._faults.get(path)
            return faults.pop(0) if faults else None

    def count_sent(self, path, count):
        with self._lock:
            self.sent[path] = self.sent.get(path, 0) + count

    def sending(self, change):
        """Count the bodies being sent at once (`most_in_flight`: how many connections a client used)."""
        with self._lock:
            self.in_flight += change
            self.most_in_flight = max(self.most_in_flight, self.in_flight)

    def by_sha256(self, sha256):
        for repo in self.repos.values():
            for path, meta in repo.files.items():
                if meta["sha256"] == sha256:
                    return path, meta
        return None, None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address, handler, standin, role):
        self.standin = standin
        self.role = role
        super().__init__(address, handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._answer(head=True)

    def do_GET(self):
        self._answer(head=False)

    # ---- routing --------------------------------------------------------------------------------

    def _answer(self, head):
        standin = self.server.standin
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        standin.requests.append(
            {
                "server": self.server.role,
                "method": self.command,
                "path": self.path,
                "range": self.headers.get("Range"),
                "authorization": self.headers.get("Authorization"),
            }
        )
        if self.server.role == "cdn":
            match = re.fullmatch(r"/cdn/([0-9a-f]{64})", path)
            file_path, meta = standin.by_sha256(match.group(1)) if match else (None, None)
            if meta is None:
                return self._json(404, {"error": "Not found"}, head)
            return self._send_file(file_path, meta, head, {"ETag": f'"{meta["sha256"]}"'})
        if standin.token and self.headers.get("Authorization") != f"Bearer {standin.token}":
            return self._json(401, {"error": "Invalid credentials in Authorization header"}, head)
        api = re.fullmatch(r"/api/models/(.+?)/(revision|tree)/([^/]+)(/.*)?", path)
        if api:
            return self._api(api.group(1), api.group(2), api.group(3), head)
        resolve = re.fullmatch(r"/(.+?)/resolve/([^/]+)/(.+)", path)
        if resolve:
            return self._resolve(resolve.group(1), resolve.group(2), resolve.group(3), head)
        return self._json(404, {"error": "Not found"}, head)

    def _repo_at(self, name, revision, head):
        repo = self.server.standin.repos.get(name)
        if repo is None:
            self._json(401, {"error": "Repository not found"}, head, {"X-Error-Code": "RepoNotFound"})
            return None, None
        commit = repo.resolve(revision)
        if commit is None:
            self._json(404, {"error": f"Invalid rev id: {revision}"}, head, {"X-Error-Code": "RevisionNotFound"})
            return None, None
        return repo, commit

    def _api(self, name, kind, revision, head):
        repo, commit = self._repo_at(name, revision, head)
        if repo is None:
            return None
        if kind == "tree":
            return self._json(200, repo.tree(), head)
        info = {"id": name, "modelId": name, "sha": commit, "private": False, "siblings": repo.siblings()}
        return self._json(200, info, head)

    def _resolve(self, name, revision, file_path, head):
        repo, commit = self._repo_at(name, revision, head)
        if repo is None:
            return None
        meta = repo.files.get(file_path)
        headers = {"X-Repo-Commit": commit}
        if meta is None:
            return self._json(404, {"error": "Entry not found"}, head, {**headers, "X-Error-Code": "EntryNotFound"})
        if meta["sha256"] is None:
            return self._send_file(file_path, meta, head, {**headers, "ETag": f'"{meta["blob"]}"'})
        self.send_response(302)
        self.send_header("Location", f"{self.server.standin.cdn}/cdn/{meta['sha256']}")
        self.send_header("X-Repo-Commit", commit)
        self.send_header("X-Linked-Etag", f'"{meta["sha256"]}"')
        self.send_header("X-Linked-Size", str(meta["size"]))
        self.send_header("ETag", f'"{meta["blob"]}"')
        self.send_header("Content-Length", "0")
        self.end_headers()
        return None

    # ---- answers --------------------------------------------------------------------------------

    def _json(self, status, data, head, headers=None):
        body = json.dumps(data).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _send_file(self, file_path, meta, head, headers):
        standin = self.server.standin
        size = meta["size"]
        start, end, status = 0, size, 200
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if wanted and not standin.ignore_ranges:
            start = int(wanted.group(1))
            end = min(size, int(wanted.group(2)) + 1) if wanted.group(2) else size
            if start >= size or start >= end:
                return self._json(416, {"error": "Range Not Satisfiable"}, head, {"Content-Range": f"bytes */{size}"})
            status = 206
        fault = None if head else standin.take_fault(file_path)
        if fault and fault["kind"] == "status":
            return self._json(fault["status"], {"error": "injected"}, head)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if head:
            return None
        self.wfile.flush()
        length = end - start
        if fault and fault["kind"] == "cut":
            length = min(length, fault["after"])
        standin.sending(+1)
        try:
            with open(meta["full"], "rb") as handle:
                if fault and fault["kind"] == "corrupt":
                    handle.seek(start)
                    data = bytearray(handle.read(length))
                    data[len(data) // 2] ^= 0xFF
                    self.wfile.write(bytes(data))
                    sent = len(data)
                else:
                    sent = self.connection.sendfile(handle, start, length) if length else 0
        except (BrokenPipeError, ConnectionResetError):  # the client took what it wanted (a range split off)
            self.close_connection = True
            sent = 0
        finally:
            standin.sending(-1)
        standin.count_sent(file_path, sent)
        if fault and fault["kind"] == "cut":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("root", help="directory holding owner/name/ repositories")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cdn-port", type=int, default=0)
    parser.add_argument("--token")
    args = parser.parse_args(argv)
    standin = HubStandIn(args.root, args.token, port=args.port, cdn_port=args.cdn_port)
    for owner in sorted(os.listdir(args.root)):
        for name in sorted(os.listdir(os.path.join(args.root, owner))):
            standin.add_repo(f"{owner}/{name}")
    standin.start()
    print(json.dumps({"endpoint": standin.endpoint, "cdn": standin.cdn, "repos": sorted(standin.repos)}), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        standin.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
