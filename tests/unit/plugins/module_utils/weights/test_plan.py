"""The plan of a weights fetch: what is kept, resumed or fetched again, byte ranges, and the disk check."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.weights.listing import (
    MANIFEST_NAME,
    PARTIAL_DIR,
    RemoteFile,
    WeightsError,
)
from ansible_collections.llmops.vllm.plugins.module_utils.weights.plan import (
    ByteRanges,
    blocking_file,
    check_space,
    nearest_existing_directory,
    plan_fetch,
    required_free_bytes,
)

HUB = {"kind": "hub", "repo": "MiniMaxAI/MiniMax-M2.5", "revision": "main"}


def sha(data):
    return hashlib.sha256(data).hexdigest()


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


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
