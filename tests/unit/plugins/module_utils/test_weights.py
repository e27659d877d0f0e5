"""Weights: file lists of each source, the fetch plan, the disk check, names the hub accepts, and fetches
from an HTTP mirror and a path.

The hub is not reachable from the test machines: its file list is tested on the JSON shape of its model
API (what huggingface_hub's HfApi.model_info(files_metadata=True) reads), and the fetch from it against
the stand-in in test_weights_fetch.py. HTTP mirrors run on loopback: one server honours Range requests
like nginx, one ignores them like `python3 -m http.server`.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import threading
from types import SimpleNamespace

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils import _weights as weights
from ansible_collections.llmops.vllm.plugins.module_utils._weights import (
    MANIFEST_NAME,
    PARTIAL_DIR,
    ByteRanges,
    HubSource,
    MirrorHttpSource,
    PathSource,
    RemoteFile,
    WeightsError,
    blocking_file,
    check_space,
    hub_endpoint,
    hub_files,
    listing_links,
    nearest_existing_directory,
    plan_fetch,
    repo_problem,
    required_free_bytes,
    revision_problem,
    select_files,
)
from ansible_collections.llmops.vllm.plugins.module_utils._weights_fetch import (
    Fetcher,
    Manifest,
    Progress,
    default_workers,
)

HUB = {"kind": "hub", "repo": "MiniMaxAI/MiniMax-M2.5", "revision": "main"}

# The shape of GET /api/models/MiniMaxAI/MiniMax-M2.5/revision/main?blobs=true (sizes of 2 of 126 shards).
MODEL_INFO = {
    "id": "MiniMaxAI/MiniMax-M2.5",
    "sha": "0f3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a",
    "siblings": [
        {"rfilename": ".gitattributes", "blobId": "a6344aac8c09253b3b630fb776ae94478aa0275b", "size": 1519},
        {"rfilename": "config.json", "blobId": "5b1f0a7e2c4d3e8f9a6b0c1d2e3f4a5b6c7d8e9f", "size": 2734},
        {
            "rfilename": "model-00001-of-00126.safetensors",
            "blobId": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4",
            "size": 1836036096,
            "lfs": {"sha256": "9" * 64, "size": 1836036096, "pointerSize": 135},
        },
        {
            "rfilename": "model-00002-of-00126.safetensors",
            "blobId": "d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3",
            "size": 1833910344,
            "lfs": {"sha256": "8" * 64, "size": 1833910344, "pointerSize": 135},
        },
        {"rfilename": "docs/deploy_guide.md", "size": 9012},
    ],
}


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


# ---- file lists ----------------------------------------------------------------------------------


def test_hub_files_take_sizes_and_lfs_hashes():
    files = hub_files(MODEL_INFO)
    assert files[1] == RemoteFile("config.json", 2734, None)
    assert files[2] == RemoteFile("model-00001-of-00126.safetensors", 1836036096, "9" * 64)
    assert sum(file.size for file in files) == 1519 + 2734 + 1836036096 + 1833910344 + 9012


def test_hub_files_without_sizes_are_refused():
    with pytest.raises(WeightsError, match=r"no size for 'config\.json'"):
        hub_files({"siblings": [{"rfilename": "config.json"}]})


@pytest.mark.parametrize("path", ["/etc/passwd", "../../etc/passwd", "a/../../b", "..", MANIFEST_NAME, ""])
def test_files_outside_the_directory_are_refused(path):
    with pytest.raises(WeightsError, match="outside the weights directory"):
        hub_files({"siblings": [{"rfilename": path, "size": 1}]})


def test_files_in_the_partial_directory_are_refused():
    with pytest.raises(WeightsError, match="unfinished files"):
        hub_files({"siblings": [{"rfilename": f"{PARTIAL_DIR}/model.safetensors", "size": 1}]})


@pytest.mark.parametrize(
    "repo", ["MiniMaxAI/MiniMax-M2.5", "moonshotai/Kimi-K2.5", "gpt2", "nvidia/Kimi-K2.5-NVFP4", "a_b/c.d"]
)
def test_repository_names_the_hub_accepts(repo):
    assert repo_problem(repo) is None


@pytest.mark.parametrize(
    ("repo", "why"),
    [
        ("llmops/..", "'..'"),
        ("../etc", "'..'"),
        ("owner/a..b", "'..'"),
        ("a/b/c", "one slash"),
        ("owner/", "each part"),
        ("/name", "each part"),
        ("owner/-name", "each part"),
        ("owner/name.", "each part"),
        ("own er/name", "each part"),
        ("owner/x--y", "'--'"),
        ("", "owner/name"),
        (None, "owner/name"),
    ],
)
def test_repository_names_the_hub_refuses(repo, why):
    assert why in repo_problem(repo)


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/12", "0f3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a", "a_b"])
def test_revisions_the_hub_accepts(revision):
    assert revision_problem(revision) is None


@pytest.mark.parametrize(
    "revision", ["", "main branch", "a..b", "v1:2", "x~1", "x^", "a*", "a[b", "a\\b", "@", "@{u}", "x.", "/main",
                 "main/", "a//b", ".hidden", "refs/.x", "x.lock", "tab\tx", "x" * 256],
)  # fmt: skip
def test_revisions_the_hub_refuses(revision):
    assert revision_problem(revision)


def test_hub_endpoint_comes_from_the_caller_then_hf_endpoint(monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert hub_endpoint() == "https://huggingface.co"
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.lab:8080/")
    assert hub_endpoint() == "http://hub.lab:8080"
    assert hub_endpoint("https://proxy.lab") == "https://proxy.lab"


def test_allow_patterns_follow_the_hub():
    files = hub_files(MODEL_INFO)
    chosen = select_files(files, ["*.safetensors", "config.json", "docs/"])
    assert [file.path for file in chosen] == [
        "config.json",
        "model-00001-of-00126.safetensors",
        "model-00002-of-00126.safetensors",
        "docs/deploy_guide.md",
    ]
    assert select_files(files, []) == files


def test_listing_links_of_nginx_and_python_http_server():
    nginx = (
        "<html><head><title>Index of /tiny/</title></head><body><h1>Index of /tiny/</h1><hr><pre>"
        '<a href="../">../</a>\n<a href="sub%20dir/">sub dir/</a>   30-Nov-2026 05:00  -\n'
        '<a href="config.json">config.json</a>  30-Nov-2026 05:00  688\n'
        '<a href=".llmops-tiny-model.json">.llmops-tiny-model.json</a>\n</pre><hr></body></html>'
    )
    python = (
        '<ul>\n<li><a href="config.json">config.json</a></li>\n<li><a href="model.safetensors">model.safetensors</a>'
        '</li>\n<li><a href="?C=N;O=D">Name</a></li><li><a href="/elsewhere/">x</a></li>'
        '<li><a href="http://other/">y</a></li></ul>'
    )
    assert listing_links(nginx) == ["sub dir/", "config.json"]
    assert listing_links(python) == ["config.json", "model.safetensors"]


# ---- planning ------------------------------------------------------------------------------------


def test_plan_keeps_complete_resumes_short_and_refetches_long_or_corrupt(tmp_path):
    good, short, long, corrupt = b"a" * 10, b"b" * 10, b"c" * 10, b"d" * 10
    write(tmp_path / "good", good)
    write(tmp_path / "short", short[:4])
    write(tmp_path / "long", long + b"xx")
    write(tmp_path / "corrupt", b"D" * 10)
    files = [
        RemoteFile("good", 10, sha(good)),
        RemoteFile("short", 10, sha(short)),
        RemoteFile("long", 10),
        RemoteFile("corrupt", 10, sha(corrupt)),
        RemoteFile("missing/part", 7),
    ]
    steps = plan_fetch(files, str(tmp_path), HUB)
    assert [(step.action, step.offset, step.bytes_needed) for step in steps] == [
        ("keep", 0, 0),
        ("resume", 4, 6),
        ("fetch", 0, 10),
        ("fetch", 0, 10),
        ("fetch", 0, 7),
    ]
    assert steps[3].reason == "corrupt: SHA-256 differs"
    assert steps[2].reason == "corrupt: 12 bytes, the source has 10"


def test_plan_checks_files_without_a_source_hash_against_the_manifest(tmp_path):
    write(tmp_path / "config.json", b"{}")
    record = {"size": 2, "sha256": sha(b"{}"), "mtime_ns": os.stat(tmp_path / "config.json").st_mtime_ns}
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({"source": HUB, "files": {"config.json": record}}))
    file = RemoteFile("config.json", 2)
    assert plan_fetch([file], str(tmp_path), HUB)[0].reason == "verified before, unchanged"
    write(tmp_path / "config.json", b"[]")  # same size, new content and mtime
    assert plan_fetch([file], str(tmp_path), HUB)[0].reason == "corrupt: SHA-256 differs"
    other = dict(HUB, revision="v2")
    assert plan_fetch([file], str(tmp_path), other)[0].action == "fetch"


def test_disk_check_names_both_numbers():
    assert required_free_bytes(0, 0.05, 1 << 30) == 0
    assert required_free_bytes(1000, 0.05, 100) == 1150
    assert check_space(1000, 1150, 0.05, 100, "/srv") == 1150
    with pytest.raises(WeightsError) as error:
        check_space(230_000_000_000, 100_000_000_000, 0.05, 1 << 30, "/var/lib/vllm")
    message = str(error.value)
    assert "needs 230000000000 bytes (214.2 GiB)" in message
    assert "only 100000000000 bytes (93.1 GiB) are free" in message
    assert "on /var/lib/vllm" in message and "nothing was written" in message


def test_plan_resumes_the_ranges_a_partial_copy_holds(tmp_path):
    data = os.urandom(5000)
    file = RemoteFile("model.safetensors", 5000, sha(data))
    write(tmp_path / PARTIAL_DIR / "model.safetensors", data[:1000] + bytes(3000) + data[4000:])
    record = {"size": 5000, "sha256": sha(data), "have": [[0, 1000], [4000, 5000]]}
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({"source": HUB, "missing": {file.path: record}}))
    step = plan_fetch([file], str(tmp_path), HUB)[0]
    assert (step.action, step.have, step.offset, step.bytes_needed) == ("resume", ((0, 1000), (4000, 5000)), 2000, 3000)
    assert step.resume_from == "partial"
    # A fetch that cannot ask for ranges, another file at the same path, or nonsense ranges: fetched whole.
    assert plan_fetch([file], str(tmp_path), HUB, ranges=False)[0].action == "fetch"
    assert plan_fetch([RemoteFile(file.path, 5000, sha(b"x"))], str(tmp_path), HUB)[0].action == "fetch"
    assert plan_fetch([RemoteFile(file.path, 5000)], str(tmp_path), HUB)[0].action == "fetch"
    record["sha256"] = None  # a mirror without hashes: its partial copy resumes, checked by size
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({"source": HUB, "missing": {file.path: record}}))
    assert plan_fetch([RemoteFile(file.path, 5000)], str(tmp_path), HUB)[0].action == "resume"
    record["sha256"] = sha(data)
    record["have"] = [[0, 6000]]
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({"source": HUB, "missing": {file.path: record}}))
    assert plan_fetch([file], str(tmp_path), HUB)[0].action == "fetch"


def test_byte_ranges_merge_and_say_what_is_missing():
    ranges = ByteRanges([(10, 20), (30, 40)])
    ranges.add(20, 25)
    ranges.add(50, 60)
    assert ranges.as_list() == [[10, 25], [30, 40], [50, 60]]
    ranges.add(5, 55)
    assert ranges.as_list() == [[5, 60]]
    assert ranges.covered() == 55 and ranges.contiguous_end(7) == 60 and ranges.contiguous_end(2) == 2
    assert ranges.missing(70) == [(0, 5), (60, 70)]
    assert ByteRanges().missing(3) == [(0, 3)] and ByteRanges([(0, 3)]).missing(3) == []


def test_nearest_existing_directory(tmp_path):
    assert nearest_existing_directory(str(tmp_path / "a" / "b" / "c")) == str(tmp_path)
    assert nearest_existing_directory(str(tmp_path)) == str(tmp_path)


def test_blocking_file(tmp_path):
    write(tmp_path / "file", b"x")
    assert blocking_file(str(tmp_path / "file" / "weights" / "tiny")) == str(tmp_path / "file")
    assert blocking_file(str(tmp_path / "file")) == str(tmp_path / "file")
    assert blocking_file(str(tmp_path / "a" / "b")) is None


def test_default_workers_follow_the_cores():
    assert [default_workers(cpus) for cpus in (1, 2, 4, 8, 16, 64)] == [4, 4, 8, 16, 32, 32]
    assert default_workers() >= 4


def test_progress_reports_rate_and_eta(tmp_path):
    now = [100.0]
    progress = Progress(str(tmp_path / "progress.json"), needed=1000, interval=1.0, clock=lambda: now[0])
    now[0] = 102.0
    progress.begin("model-00001.safetensors")
    progress.begin("model-00002.safetensors")
    progress.advance(400)
    written = json.loads((tmp_path / "progress.json").read_text())
    assert written == {
        "done_bytes": 400,
        "needed_bytes": 1000,
        "percent": 40.0,
        "bytes_per_second": 200,
        "eta_seconds": 3,
        "elapsed_seconds": 2.0,
        "file": "model-00001.safetensors",
        "files_in_flight": 2,
    }
    now[0] = 102.5
    progress.advance(100)
    assert json.loads((tmp_path / "progress.json").read_text())["done_bytes"] == 400  # at most once a second


# ---- fetching over HTTP and from a path ------------------------------------------------------------


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


def test_hub_source_lists_from_the_model_api_and_sends_the_token_only_there(tmp_path):
    seen = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            body = json.dumps(MODEL_INFO).encode()
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
    assert hub.commit == MODEL_INFO["sha"] and len(files) == 5
    assert hub.url("model-00001-of-00126.safetensors").endswith(
        f"/MiniMaxAI/MiniMax-M2.5/resolve/{MODEL_INFO['sha']}/model-00001-of-00126.safetensors"
    )


def test_redirects_to_another_host_drop_the_token():
    handler = weights._NoCredentialsOnRedirect()
    request = weights.urllib.request.Request("https://huggingface.co/x", headers={"Authorization": "Bearer t"})
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
