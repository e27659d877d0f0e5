"""The hub through huggingface_hub (the release the test venv has, as vLLM's venv does), against the stand-in
that answers as the hub does: model info with file metadata, HEAD on resolve URLs with X-Repo-Commit and
X-Linked-Etag, redirects of LFS files to a CDN on another origin, Range.

What the stand-in cannot show: Xet storage (hf_xet), which the real hub serves for most large repositories;
the stand-in's answers carry no Xet headers, so the library downloads over plain HTTP.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.weights import hub_client
from ansible_collections.llmops.vllm.plugins.module_utils.weights.fetch import Manifest, Progress
from ansible_collections.llmops.vllm.plugins.module_utils.weights.hub_client import (
    LibrarySource,
    choose_client,
    fetch_with_library,
)
from ansible_collections.llmops.vllm.plugins.module_utils.weights.listing import (
    MANIFEST_NAME,
    PARTIAL_DIR,
    WeightsError,
    local_files,
)
from ansible_collections.llmops.vllm.plugins.module_utils.weights.plan import plan_fetch

huggingface_hub = pytest.importorskip("huggingface_hub")

REPO = "me/model"
HUB = {"kind": "hub", "repo": REPO, "revision": "main"}
BIG = "model-00001-of-00002.safetensors"


def sha(data):
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def model(hub_repo):
    """Two shards and two small files on the stand-in."""
    return hub_repo(
        {
            "config.json": b'{"model_type": "llama"}',
            "tokenizer_config.json": b"{}",
            BIG: os.urandom(3 << 20),
            "model-00002-of-00002.safetensors": os.urandom(1 << 20),
        }
    )


def library_fetch(standin, dest, workers=4):
    source = LibrarySource(huggingface_hub, REPO, "main", standin.endpoint, "hf_secret", timeout=10)
    files = source.files()
    steps = plan_fetch(files, dest, HUB, ranges=False, workers=workers)
    os.makedirs(dest, exist_ok=True)
    progress = Progress(None, sum(step.bytes_needed for step in steps))
    manifest = Manifest(dest, HUB, {file.path for file in files}, source.commit)
    fetch_with_library(source, steps, dest, manifest, progress, workers)
    return source, steps, progress


def manifest_of(dest):
    with open(os.path.join(dest, MANIFEST_NAME), encoding="utf-8") as handle:
        return json.load(handle)


def assert_verified(dest, files):
    records = manifest_of(dest)["files"]
    for file in local_files(dest):
        with open(os.path.join(dest, file.path), "rb") as handle:
            assert handle.read() == files[file.path]
        assert records[file.path]["sha256"] == sha(files[file.path])


def test_the_library_fetches_at_the_commit_with_the_hubs_hashes_and_the_token_only_to_the_hub(model):
    standin, files, dest = model.standin, model.files, model.dest
    source, steps, progress = library_fetch(standin, dest)
    assert source.commit == standin.repos[REPO].commit
    assert {step.file.path: step.file.sha256 for step in steps}[BIG] == sha(files[BIG])
    assert progress.done == sum(len(data) for data in files.values())  # the library's bytes, counted
    manifest = manifest_of(dest)
    assert manifest["complete"] is True and manifest["commit"] == source.commit
    assert sorted(file.path for file in local_files(dest)) == sorted(files)
    assert_verified(dest, files)
    hub_paths = [request["path"] for request in standin.requests if request["server"] == "hub"]
    assert f"/api/models/{REPO}/revision/main?blobs=true" in hub_paths
    assert f"/{REPO}/resolve/{source.commit}/{BIG}" in hub_paths  # the pinned commit, not the branch
    sent = {(request["server"], request["authorization"]) for request in standin.requests}
    assert sent == {("hub", "Bearer hf_secret"), ("cdn", None)}


def test_a_file_whose_hash_differs_is_fetched_again_then_refused(model):
    standin, files, dest = model.standin, model.files, model.dest
    standin.fail(BIG, "corrupt")
    library_fetch(standin, dest)
    assert standin.sent[BIG] == 2 * len(files[BIG])
    assert_verified(dest, files)

    os.remove(os.path.join(dest, BIG))
    standin.fail(BIG, "corrupt", count=2)
    with pytest.raises(WeightsError, match=r"SHA-256 \w+ differs .* fetched twice; the source itself is bad"):
        library_fetch(standin, dest)
    assert not os.path.exists(os.path.join(dest, BIG))
    assert list(manifest_of(dest)["missing"]) == [BIG]
    assert_verified(dest, files)


def test_a_failed_fetch_leaves_the_manifest_saying_what_is_missing_and_the_next_fetches_it(model):
    standin, files, dest = model.standin, model.files, model.dest
    standin.fail(BIG, "status", status=403)
    with pytest.raises(WeightsError, match=rf"could not fetch {BIG}: .*403.* files are missing, as .* run again"):
        library_fetch(standin, dest, workers=1)
    manifest = manifest_of(dest)
    assert manifest["complete"] is False and BIG in manifest["missing"]
    assert not os.path.exists(os.path.join(dest, BIG))
    assert sorted(manifest["missing"]) == sorted(set(files) - set(manifest["files"]))
    assert_verified(dest, files)

    # The library keeps no partial file across runs: leftovers of killed runs are removed, the file comes whole.
    leftover = os.path.join(dest, ".cache", "huggingface", "download", "x.0123.abcd.incomplete")
    os.makedirs(os.path.dirname(leftover), exist_ok=True)
    partial = os.path.join(dest, PARTIAL_DIR, BIG)
    os.makedirs(os.path.dirname(partial))
    for path in (leftover, partial):
        with open(path, "wb") as handle:
            handle.write(b"x" * 1000)
    _source, steps, _progress = library_fetch(standin, dest)
    assert sorted(step.file.path for step in steps if step.action != "keep") == sorted(manifest["missing"])
    assert not os.path.exists(leftover) and not os.path.exists(partial)
    assert manifest_of(dest)["complete"] is True
    assert_verified(dest, files)


def test_hub_errors_name_the_repository_and_the_status(model):
    standin = model.standin
    standin.token = "another"
    with pytest.raises(WeightsError, match=rf"huggingface_hub could not list {REPO} at main: .*401") as error:
        LibrarySource(huggingface_hub, REPO, "main", standin.endpoint, "hf_secret").files()
    assert error.value.status == 401


def test_the_client_is_chosen_by_the_source_the_setting_and_the_python(monkeypatch):
    assert choose_client("auto", None)[1]["name"] == "huggingface_hub"
    assert choose_client("auto", "http://mirror/models")[1]["name"] == "builtin"
    assert choose_client("builtin", None)[1]["reason"] == "hub_client=builtin"

    def no_library(name):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(hub_client.importlib, "import_module", no_library)
    library, client = choose_client("auto", None)
    assert library is None and client["name"] == "builtin" and "cannot import huggingface_hub" in client["reason"]
    with pytest.raises(WeightsError, match=r"hub_client=huggingface_hub, but .* cannot import huggingface_hub"):
        choose_client("huggingface_hub", None)
