"""weights_prefetch on this machine: real weight files read under the host's real MemAvailable, nothing read in
check mode or when they do not fit, and bad input refused."""

import re

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.weights import page_cache
from ansible_collections.llmops.vllm.plugins.modules import weights_prefetch


@pytest.fixture
def run(run_module):
    return lambda args, fails=False: run_module(weights_prefetch.main, args, fails)


@pytest.fixture
def reading_fails(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("the weights were read")

    monkeypatch.setattr(page_cache, "read_into_cache", refuse)


@pytest.fixture
def model(tmp_path):
    """A model in the hub's cache layout: a snapshot's shards link to blobs, beside a config and a tokenizer."""
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / "0f3c2b1a"
    blobs.mkdir()
    snapshot.mkdir(parents=True)
    for name, blob, size in (
        ("model-00001-of-00002.safetensors", "e3b0", 3 * 1024 * 1024),
        ("model-00002-of-00002.safetensors", "d4e5", 1024 * 1024 + 7),
        ("config.json", "5b1f", 2734),
        ("tokenizer.json", "a634", 1519),
    ):
        (blobs / blob).write_bytes(b"\x01" * size)
        (snapshot / name).symlink_to(f"../../blobs/{blob}")
    # A second name for the first shard, as an older snapshot keeps it.
    (tmp_path / "snapshots" / "9a8b7c6d").mkdir()
    (tmp_path / "snapshots" / "9a8b7c6d" / "model-00001-of-00002.safetensors").symlink_to("../../blobs/e3b0")
    return tmp_path


def test_reads_each_shard_once_and_changes_nothing(run, model):
    result = run({"path": str(model), "reserve_mib": 0})
    weights = 3 * 1024 * 1024 + 1024 * 1024 + 7
    assert (result["files"], result["bytes"], result["read_bytes"]) == (2, weights, weights)
    assert (result["prefetched"], result["complete"], result["reason"], result["changed"]) == (True, True, "", False)
    assert result["mem_available_bytes"] > 0 and result["seconds"] >= 0
    assert re.fullmatch(r"read 0\.00 GiB of 2 files into the page cache in \d+\.\d s( \(\d+ MiB/s\))?", result["msg"])


def test_patterns_choose_the_files(run, model):
    result = run({"path": str(model), "patterns": ["*.json"], "reserve_mib": 0})
    assert (result["files"], result["bytes"], result["read_bytes"]) == (2, 2734 + 1519, 2734 + 1519)


def test_check_mode_reads_nothing(run, model, reading_fails):
    result = run({"path": str(model), "reserve_mib": 0, "_ansible_check_mode": True})
    assert (result["prefetched"], result["read_bytes"], result["reason"], result["changed"]) == (
        False, 0, "check mode", False,
    )  # fmt: skip
    assert result["bytes"] == 4 * 1024 * 1024 + 7
    assert result["msg"] == "check mode: would read 0.00 GiB of 2 files into the page cache"


def test_weights_that_do_not_fit_the_reserve_are_skipped(run, model, reading_fails):
    # A reserve of 1 PiB: no host has it to spare.
    result = run({"path": str(model), "reserve_mib": 1024**3})
    assert (result["prefetched"], result["complete"], result["read_bytes"], result["changed"]) == (
        False,
        True,
        0,
        False,
    )
    assert re.fullmatch(
        r"0\.0 GiB of weights do not fit \d+\.\d GiB available less the 1048576\.0 GiB reserve", result["reason"]
    )
    assert result["msg"] == f"skipped: {result['reason']}"


def test_a_missing_path_fails(run, tmp_path, reading_fails):
    missing = tmp_path / "models" / "minimax_m25"
    result = run({"path": str(missing)}, fails=True)
    assert result["msg"] == (
        f"no weight files matching *.safetensors, *.bin, *.pt, *.pth, *.gguf under {missing}: it does not exist"
    )


def test_a_directory_without_matching_files_fails(run, model, reading_fails):
    result = run({"path": str(model), "patterns": ["*.gguf"]}, fails=True)
    assert result["msg"].startswith(f"no weight files matching *.gguf under {model}: download the model first")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"timeout": 0}, "timeout must be more than 0 seconds, got 0.0"),
        ({"reserve_mib": -1}, "reserve_mib must be 0 MiB or more, got -1"),
        ({"patterns": []}, "patterns must name the weight files, such as *.safetensors, got []"),
        ({"patterns": ["*.bin", ""]}, "patterns must name the weight files, such as *.safetensors, got ['*.bin', '']"),
    ],
)
def test_bad_input_is_refused_before_anything_is_read(run, model, reading_fails, changes, message):
    assert run({"path": str(model), **changes}, fails=True)["msg"] == message
