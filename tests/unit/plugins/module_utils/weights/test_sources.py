"""Where weights come from: the hub endpoint, fetches from an HTTP mirror and a path, the hub's model API.

HTTP mirrors run on loopback: one server honours Range requests like nginx, one ignores them like
`python3 -m http.server`. The fetch from the hub itself is tested against the stand-in in test_weights_fetch.py.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import threading
import urllib.request
from types import SimpleNamespace

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.weights.fetch import (
    Fetcher,
    Manifest,
    Progress,
)
from ansible_collections.llmops.vllm.plugins.module_utils.weights.listing import (
    MANIFEST_NAME,
    PARTIAL_DIR,
    RemoteFile,
    WeightsError,
)
from ansible_collections.llmops.vllm.plugins.module_utils.weights.plan import (
    plan_fetch,
)
from ansible_collections.llmops.vllm.plugins.module_utils.weights.sources import (
    HubSource,
    MirrorHttpSource,
    PathSource,
    _NoCredentialsOnRedirect,
    hub_endpoint,
)

HUB = {"kind": "hub", "repo": "MiniMaxAI/MiniMax-M2.5", "revision": "main"}


def sha(data):
    return hashlib.sha256(data).hexdigest()


def fetch(source, steps, dest, description, progress, workers=4):
    """The module's fetch: the manifest of `dest`, then the steps, `workers` at a time."""
    os.makedirs(dest, exist_ok=True)
    manifest = Manifest(dest, description, {step.file.path for step in steps})
    return Fetcher(source, dest, manifest, progress, workers, retry_delay=0).run(steps)


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_hub_endpoint_comes_from_the_caller_then_hf_endpoint(monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert hub_endpoint() == "https://huggingface.co"
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.lab:8080/")
    assert hub_endpoint() == "http://hub.lab:8080"
    assert hub_endpoint("https://proxy.lab") == "https://proxy.lab"


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """A file server that honours `Range: bytes=A-B` (and `bytes=A-`) as nginx does, and counts the bytes it sends."""

    sent = {}

    def log_message(self, *args):
        pass

    def send_head(self):
        wanted = self.headers.get("Range")
        path = self.translate_path(self.path)
        if not wanted or not os.path.isfile(path):
            return super().send_head()
        first, last = wanted.removeprefix("bytes=").split("-")
        handle = open(path, "rb")  # noqa: SIM115 - closed by the base class after copyfile
        size = os.fstat(handle.fileno()).st_size
        start, end = int(first), min(size, int(last) + 1) if last else size
        handle.seek(start)
        self.length = end - start
        self.send_response(206)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        return handle

    def copyfile(self, source, outputfile):
        data = source.read(getattr(self, "length", -1))
        RangeHandler.sent[self.path] = RangeHandler.sent.get(self.path, 0) + len(data)
        outputfile.write(data)


class PlainHandler(RangeHandler):
    """`python3 -m http.server`: Range requests get the whole file with status 200."""

    def send_head(self):
        return http.server.SimpleHTTPRequestHandler.send_head(self)


@pytest.fixture(params=[RangeHandler, PlainHandler], ids=["range", "no-range"])
def mirror(request, tmp_path):
    root = tmp_path / "mirror"
    model = os.urandom(300_000)
    write(root / "llmops" / "tiny" / "model.safetensors", model)
    write(root / "llmops" / "tiny" / "config.json", b'{"model_type": "llama"}')
    RangeHandler.sent = {}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(request.param, directory=str(root)))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/llmops/tiny"
    yield SimpleNamespace(url=url, root=root / "llmops" / "tiny", model=model, handler=request.param)
    server.shutdown()
    server.server_close()


def test_http_mirror_fetch_resumes_and_verifies(mirror, tmp_path):
    url, model, handler = mirror.url, mirror.model, mirror.handler
    dest = tmp_path / "weights"
    source = MirrorHttpSource(url)
    files = source.files()
    assert sorted((file.path, file.size) for file in files) == [("config.json", 23), ("model.safetensors", 300_000)]

    write(dest / "model.safetensors", model[:100_000])  # what an interrupted download leaves
    steps = plan_fetch(files, str(dest), HUB)
    assert sum(step.bytes_needed for step in steps) == 23 + 200_000
    progress = Progress(None, 23 + 200_000)
    records = fetch(source, steps, str(dest), HUB, progress)

    assert (dest / "model.safetensors").read_bytes() == model
    assert records["model.safetensors"]["sha256"] == sha(model)
    if handler is RangeHandler:
        assert RangeHandler.sent["/llmops/tiny/model.safetensors"] == 200_000
        assert progress.done == 200_023
    else:  # the whole file comes again; the answer to the request from byte 100000 was not used
        assert progress.done == progress.needed == 300_023

    # The manifest now serves as the mirror's: a second host gets the hashes with the sizes.
    assert {file.path: file.sha256 for file in PathSource(str(dest)).files()} == {
        "config.json": sha(b'{"model_type": "llama"}'),
        "model.safetensors": sha(model),
    }
    assert all(step.action == "keep" for step in plan_fetch(files, str(dest), HUB))


def test_http_mirror_manifest_gives_hashes_that_catch_a_bad_copy(mirror, tmp_path):
    url, root, model = mirror.url, mirror.root, mirror.model
    manifest = {"source": HUB, "files": {"model.safetensors": {"size": len(model), "sha256": sha(b"other")}}}
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    source = MirrorHttpSource(url)
    files = source.files()
    assert files == [RemoteFile("model.safetensors", len(model), sha(b"other"))]
    dest = tmp_path / "weights"
    with pytest.raises(WeightsError, match=r"SHA-256 .* differs from the source's .* fetched twice"):
        fetch(source, plan_fetch(files, str(dest), HUB), str(dest), HUB, Progress(None, len(model)))
    assert not (dest / "model.safetensors").exists() and not (dest / PARTIAL_DIR).exists()
    assert list(json.loads((dest / MANIFEST_NAME).read_text())["missing"]) == ["model.safetensors"]


def test_http_errors_name_the_url(mirror):
    with pytest.raises(WeightsError, match=r"GET .*/nothing/ answered HTTP 404"):
        MirrorHttpSource(mirror.url + "/nothing").files()


def test_hub_source_lists_from_the_model_api_and_sends_the_token_only_there(tmp_path, minimax_model_info):
    seen = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            body = json.dumps(minimax_model_info).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        hub = HubSource("MiniMaxAI/MiniMax-M2.5", "main", f"http://127.0.0.1:{server.server_address[1]}", "hf_secret")
        files = hub.files()
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [("/api/models/MiniMaxAI/MiniMax-M2.5/revision/main?blobs=true", "Bearer hf_secret")]
    assert hub.commit == minimax_model_info["sha"] and len(files) == 5
    assert hub.url("model-00001-of-00126.safetensors").endswith(
        f"/MiniMaxAI/MiniMax-M2.5/resolve/{minimax_model_info['sha']}/model-00001-of-00126.safetensors"
    )


def test_redirects_to_another_host_drop_the_token():
    handler = _NoCredentialsOnRedirect()
    request = urllib.request.Request("https://huggingface.co/x", headers={"Authorization": "Bearer t"})
    same = handler.redirect_request(request, None, 302, "Found", {}, "https://huggingface.co/y")
    other = handler.redirect_request(request, None, 302, "Found", {}, "https://cdn-lfs.hf.co/y")
    assert same.get_header("Authorization") == "Bearer t"
    assert other.get_header("Authorization") is None


def test_path_mirror_resumes_with_a_seek(tmp_path):
    data = os.urandom(50_000)
    write(tmp_path / "shared" / "model.safetensors", data)
    dest = tmp_path / "weights"
    write(dest / "model.safetensors", data[:20_000])
    source = PathSource(str(tmp_path / "shared"))
    steps = plan_fetch(source.files(), str(dest), HUB)
    progress = Progress(None, 30_000)
    fetch(source, steps, str(dest), HUB, progress)
    assert (dest / "model.safetensors").read_bytes() == data and progress.done == 30_000


def test_path_mirror_that_does_not_exist(tmp_path):
    with pytest.raises(WeightsError, match="does not exist on this host"):
        PathSource(str(tmp_path / "absent")).files()
