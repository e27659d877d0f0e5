"""The collection's own fetch against a hub stand-in that answers as the hub does (tests/hub_standin.py):
the model API, resolve URLs that redirect LFS files to a CDN on another port, Range, and faults on demand.

Several files at once, large files split into ranges, each range resumed after an interruption, the
SHA-256 computed as the bytes land; and a bad or partial source never leaves a half model that looks
whole: the manifest says what is missing, the next run resumes it, a file whose hash differs is fetched
again and never kept under its name.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.weights import fetch as weights_fetch
from ansible_collections.llmops.vllm.plugins.module_utils.weights.fetch import (
    RETRIES,
    Fetcher,
    Manifest,
    Progress,
    default_workers,
)
from ansible_collections.llmops.vllm.plugins.module_utils.weights.listing import (
    MANIFEST_NAME,
    PARTIAL_DIR,
    WeightsError,
    local_files,
)
from ansible_collections.llmops.vllm.plugins.module_utils.weights.plan import plan_fetch
from ansible_collections.llmops.vllm.plugins.module_utils.weights.sources import HubSource, PathSource

REPO = "me/model"
HUB = {"kind": "hub", "repo": REPO, "revision": "main"}
BIG = "model-00001-of-00003.safetensors"
MIB = 1 << 20


def sha(data):
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def model(hub_repo):
    """A repository of a 6 MiB shard, two of 2 MiB, and small non-LFS files, on the stand-in."""
    return hub_repo(
        {
            "config.json": b'{"model_type": "llama"}',
            "tokenizer.json": b'{"version": "1.0"}' * 50,
            "empty.txt": b"",
            BIG: os.urandom(6 * MIB + 12345),
            "model-00002-of-00003.safetensors": os.urandom(2 * MIB),
            "model-00003-of-00003.safetensors": os.urandom(2 * MIB + 7),
        }
    )


def hub(model):
    return HubSource(REPO, "main", model.standin.endpoint, "hf_secret")


def run_fetch(source, dest, workers=4):
    """List, plan and fetch as the module does; returns (steps, progress)."""
    files = source.files()
    steps = plan_fetch(files, dest, HUB, workers=workers)
    os.makedirs(dest, exist_ok=True)
    progress = Progress(None, sum(step.bytes_needed for step in steps))
    manifest = Manifest(dest, HUB, {file.path for file in files}, getattr(source, "commit", None))
    Fetcher(source, dest, manifest, progress, workers, retry_delay=0).run(steps)
    return steps, progress


def manifest_of(dest):
    with open(os.path.join(dest, MANIFEST_NAME), encoding="utf-8") as handle:
        return json.load(handle)


def missing(model, path, have):
    """The manifest's record of a missing file."""
    return {"size": len(model.files[path]), "sha256": sha(model.files[path]), "have": have}


def cdn_path(model, path):
    return f"/cdn/{sha(model.files[path])}"


def assert_nothing_looks_whole_that_is_not(model):
    """Every file under its own name is complete and verified in the manifest; no half file has a real name."""
    records = manifest_of(model.dest)["files"]
    for file in local_files(model.dest):
        with open(os.path.join(model.dest, file.path), "rb") as handle:
            assert handle.read() == model.files[file.path], file.path
        assert records[file.path]["sha256"] == sha(model.files[file.path])


class Gate:
    """The source, with streams held back until the fetch shows what it must do without being made to:
    the first stream waits until a second one opens (several files at once), the first stream of BIG until
    a second range of BIG opens (a large file split over connections). A serial fetch times out here."""

    def __init__(self, source):
        self.source = source
        self.opened = []
        self.lock = threading.Lock()
        self.several = threading.Event()
        self.split = threading.Event()

    def __getattr__(self, name):
        return getattr(self.source, name)

    def open_range(self, path, start=0, end=None):
        stream = self.source.open_range(path, start, end)
        with self.lock:
            self.opened.append((path, start))
            count, big = len(self.opened), sum(opened == BIG for opened, _start in self.opened)
        if count >= 2:
            self.several.set()
        if big >= 2:
            self.split.set()
        if count == 1:
            assert self.several.wait(5), "no second stream opened while the first was open"
        if path == BIG and big == 1:
            return Held(stream, self.split)
        return stream


class Held:
    """A stream whose first read waits for `event`."""

    def __init__(self, stream, event):
        self.stream, self.event = stream, event

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.stream.close()

    def readinto(self, view):
        assert self.event.wait(5), "the large file was not split while its first range was in flight"
        return self.stream.readinto(view)


def test_files_come_several_at_once_and_large_ones_split_over_connections(model, monkeypatch):
    monkeypatch.setattr(weights_fetch, "SPLIT_BYTES", MIB)
    gate = Gate(hub(model))
    _steps, progress = run_fetch(gate, model.dest)

    assert progress.done == sum(len(data) for data in model.files.values())
    assert_nothing_looks_whole_that_is_not(model)
    manifest = manifest_of(model.dest)
    assert manifest["complete"] is True and manifest["missing"] == {} and len(manifest["files"]) == 6
    assert manifest["commit"] == model.standin.repos[REPO].commit
    assert not os.path.exists(os.path.join(model.dest, PARTIAL_DIR))
    assert len({start for path, start in gate.opened if path == BIG}) >= 2
    # The token goes to the hub only, never to the CDN it redirects to.
    sent = {(request["server"], request["authorization"]) for request in model.standin.requests}
    assert sent == {("hub", "Bearer hf_secret"), ("cdn", None)}


def test_hashes_are_computed_from_the_bytes_as_they_land(model, monkeypatch):
    """Each file landing in one range is hashed from memory: nothing is read back after the fact."""
    reads = []
    real_pread = os.pread
    monkeypatch.setattr(weights_fetch.os, "pread", lambda *args: reads.append(args) or real_pread(*args))
    monkeypatch.setattr(weights_fetch, "SPLIT_BYTES", 1 << 40)
    run_fetch(hub(model), model.dest)
    assert reads == []
    assert_nothing_looks_whole_that_is_not(model)


def test_a_range_cut_mid_way_resumes_where_it_stopped(model):
    model.standin.fail(BIG, "cut", count=RETRIES + 2, after=MIB + 5)
    run_fetch(hub(model), model.dest, workers=1)
    assert model.standin.sent[BIG] == len(model.files[BIG])  # every byte was sent once
    last = len(model.files[BIG]) - 1
    ranges = [request["range"] for request in model.standin.requests if request["path"] == cdn_path(model, BIG)]
    assert ranges[:3] == [f"bytes=0-{last}", f"bytes={MIB + 5}-{last}", f"bytes={2 * (MIB + 5)}-{last}"]
    assert_nothing_looks_whole_that_is_not(model)


def test_an_interrupted_fetch_leaves_the_manifest_saying_what_is_missing_then_resumes(model):
    # The first MiB lands, then the connection is cut, then the source fails every retry.
    model.standin.fail(BIG, "cut", after=MIB)
    model.standin.fail(BIG, "status", count=RETRIES, status=503)
    message = r"HTTP 503 .* files are missing, as \.llmops-weights\.json records .* run again to resume"
    with pytest.raises(WeightsError, match=message):
        run_fetch(hub(model), model.dest, workers=1)

    manifest = manifest_of(model.dest)
    assert manifest["complete"] is False
    assert manifest["missing"][BIG] == missing(model, BIG, [[0, MIB]])
    assert not os.path.exists(os.path.join(model.dest, BIG))
    assert os.path.getsize(os.path.join(model.dest, PARTIAL_DIR, BIG)) == len(model.files[BIG])
    assert_nothing_looks_whole_that_is_not(model)

    # The next run (a deploy that finds it) resumes from the first missing byte and fetches nothing twice.
    model.standin.sent.clear()
    steps, progress = run_fetch(hub(model), model.dest, workers=1)
    step = next(step for step in steps if step.file.path == BIG)
    assert (step.action, step.offset, step.resume_from) == ("resume", MIB, "partial")
    assert model.standin.sent[BIG] == len(model.files[BIG]) - MIB
    assert progress.done == sum(step.bytes_needed for step in steps)
    assert manifest_of(model.dest)["complete"] is True and manifest_of(model.dest)["missing"] == {}
    assert not os.path.exists(os.path.join(model.dest, PARTIAL_DIR))
    assert_nothing_looks_whole_that_is_not(model)


def test_a_file_whose_hash_differs_is_fetched_again_not_served(model):
    model.standin.fail(BIG, "corrupt")
    run_fetch(hub(model), model.dest)
    assert model.standin.sent[BIG] == 2 * len(model.files[BIG])
    assert_nothing_looks_whole_that_is_not(model)

    # A source that sends other bytes each time fails the run; the bad copy is gone, not kept under its name.
    os.remove(os.path.join(model.dest, BIG))
    model.standin.fail(BIG, "corrupt", count=2)
    with pytest.raises(WeightsError, match=r"SHA-256 \w+ differs from the source's \w+; it was fetched twice"):
        run_fetch(hub(model), model.dest)
    assert not os.path.exists(os.path.join(model.dest, BIG))
    assert not os.path.exists(os.path.join(model.dest, PARTIAL_DIR, BIG))
    assert manifest_of(model.dest)["missing"] == {BIG: missing(model, BIG, [])}
    assert_nothing_looks_whole_that_is_not(model)


def test_a_copy_on_disk_whose_hash_differs_leaves_its_name_before_the_fetch(model):
    os.makedirs(model.dest)
    with open(os.path.join(model.dest, BIG), "wb") as handle:
        handle.write(bytes(len(model.files[BIG])))  # the right size, the wrong bytes
    model.standin.fail(BIG, "status", count=RETRIES + 1, status=503)
    with pytest.raises(WeightsError, match="HTTP 503"):
        run_fetch(hub(model), model.dest, workers=1)
    assert not os.path.exists(os.path.join(model.dest, BIG))  # not served while its fetch failed
    assert BIG in manifest_of(model.dest)["missing"]
    run_fetch(hub(model), model.dest)
    assert_nothing_looks_whole_that_is_not(model)


def test_a_file_that_only_lacked_its_hash_is_not_fetched_again(model):
    """Killed between the last byte and the move: the partial copy holds every byte; only the hash is left."""
    data = model.files[BIG]
    os.makedirs(os.path.join(model.dest, PARTIAL_DIR))
    with open(os.path.join(model.dest, PARTIAL_DIR, BIG), "wb") as handle:
        handle.write(data)
    record = {"size": len(data), "sha256": sha(data), "have": [[0, len(data)]]}
    with open(os.path.join(model.dest, MANIFEST_NAME), "w", encoding="utf-8") as handle:
        json.dump({"source": HUB, "files": {}, "missing": {BIG: record}}, handle)
    steps, _progress = run_fetch(hub(model), model.dest)
    assert next(step for step in steps if step.file.path == BIG).bytes_needed == 0
    assert BIG not in model.standin.sent
    assert_nothing_looks_whole_that_is_not(model)


def test_a_server_that_ignores_ranges_gets_whole_files_and_starts_over(model):
    model.standin.ignore_ranges = True
    os.makedirs(model.dest)
    with open(os.path.join(model.dest, BIG), "wb") as handle:
        handle.write(model.files[BIG][:MIB])  # a shorter copy: resumable only where the server has ranges
    steps, progress = run_fetch(hub(model), model.dest)
    assert next(step for step in steps if step.file.path == BIG).action == "resume"
    total = sum(len(data) for data in model.files.values())
    assert progress.done == progress.needed == total  # the shorter copy's MiB came again
    assert_nothing_looks_whole_that_is_not(model)

    # Cut mid-file, the file starts over from its first byte: 2 MiB written twice.
    os.remove(os.path.join(model.dest, BIG))
    model.standin.fail(BIG, "cut", after=2 * MIB)
    steps, progress = run_fetch(hub(model), model.dest)
    assert progress.done == progress.needed == len(model.files[BIG]) + 2 * MIB
    assert_nothing_looks_whole_that_is_not(model)


def test_a_copy_whose_manifest_lists_missing_files_is_not_a_mirror(model, tmp_path):
    model.standin.fail(BIG, "status", count=RETRIES + 1, status=503)
    with pytest.raises(WeightsError):
        run_fetch(hub(model), model.dest)
    with pytest.raises(WeightsError, match=rf"the copy at {model.dest} is incomplete: .* \d+ missing files \(.*{BIG}"):
        PathSource(model.dest).files()


def test_a_shared_path_fetches_in_ranges_too(model, tmp_path, monkeypatch):
    monkeypatch.setattr(weights_fetch, "SPLIT_BYTES", MIB)
    run_fetch(hub(model), model.dest)
    copy = str(tmp_path / "copy")
    os.makedirs(copy)
    with open(os.path.join(copy, BIG), "wb") as handle:
        handle.write(model.files[BIG][: MIB * 2])
    steps, progress = run_fetch(PathSource(model.dest), copy)
    assert next(step for step in steps if step.file.path == BIG).offset == 2 * MIB
    assert progress.done == sum(len(data) for data in model.files.values()) - 2 * MIB
    for path, data in model.files.items():
        with open(os.path.join(copy, path), "rb") as handle:
            assert handle.read() == data


def test_many_files_over_many_workers_land_each_byte_once(hub_repo, monkeypatch):
    """Races of splits, hashing and the end of a file: every file whole, verified, and no byte fetched twice."""
    monkeypatch.setattr(weights_fetch, "SPLIT_BYTES", MIB // 4)
    monkeypatch.setattr(weights_fetch, "READ_BYTES", MIB // 8)
    sizes = [0, 1, MIB // 3, MIB, 3 * MIB + 1, 5 * MIB, 2 * MIB - 1, 7 * MIB] * 3
    repo = hub_repo({f"model-{index:05d}.safetensors": os.urandom(size) for index, size in enumerate(sizes)})
    steps, progress = run_fetch(HubSource(REPO, "main", repo.standin.endpoint, "hf_secret"), repo.dest, workers=12)
    assert progress.done == progress.needed == sum(sizes) == sum(step.file.size for step in steps)
    assert manifest_of(repo.dest)["complete"] is True
    assert_nothing_looks_whole_that_is_not(repo)
    assert len(local_files(repo.dest)) == len(sizes)


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
