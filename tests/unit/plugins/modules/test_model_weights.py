"""The model_weights module end to end: a mirror on a local path, the hub stand-in through the module's own
fetch and through huggingface_hub, an interrupted fetch that the next run resumes, and bad input (the HTTP
details are in the module_utils tests)."""

import hashlib
import os

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils import _weights_fetch
from ansible_collections.llmops.vllm.plugins.module_utils._weights import PARTIAL_DIR
from ansible_collections.llmops.vllm.plugins.modules import model_weights

MODEL = bytes(range(256)) * 64
SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
def run(run_module, monkeypatch):
    """`run(args)` returns the module's result; with `fails=True`, the result it failed with."""
    monkeypatch.setattr(_weights_fetch, "RETRY_DELAY", 0)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)

    def run_model_weights(module_args, fails=False):
        return run_module(model_weights.main, module_args, fails=fails)

    return run_model_weights


@pytest.fixture
def mirror(tmp_path):
    model = tmp_path / "mirror" / "llmops" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(MODEL)
    return str(tmp_path / "mirror")


@pytest.fixture
def hub(hub_standin):
    """Repository me/model on the hub stand-in: two shards and a config."""
    files = {"config.json": b'{"model_type": "llama"}', SHARD: os.urandom(3 << 20), "model-2.safetensors": MODEL}
    hub_standin.put("me/model", files)
    hub_standin.files = files
    return hub_standin


def args(tmp_path, mirror, **more):
    return {
        "path": str(tmp_path / "weights" / "tiny"),
        "source": {"kind": "hub", "repo": "llmops/tiny"},
        "mirror": mirror,
        "reserve": "0",
        **more,
    }


def hub_args(tmp_path, **more):
    return {
        "path": str(tmp_path / "weights" / "model"),
        "source": {"kind": "hub", "repo": "me/model"},
        "reserve": "0",
        **more,
    }


def test_fetches_then_changes_nothing(tmp_path, mirror, run):
    first = run(args(tmp_path, mirror))
    assert first["changed"] is True
    assert first["fetched_bytes"] == first["needed_bytes"] == first["total_bytes"] == 23 + 16384
    assert first["fetch_client"]["name"] == "builtin" and first["workers"] >= 4
    assert (tmp_path / "weights" / "tiny" / "model.safetensors").read_bytes() == MODEL
    second = run(args(tmp_path, mirror))
    assert second["changed"] is False and second["fetched_bytes"] == 0 and second["needed_bytes"] == 0
    assert {file["action"] for file in second["files"]} == {"keep"}


@pytest.mark.parametrize("more", [{"state": "check"}, {"_ansible_check_mode": True}], ids=["state-check", "check-mode"])
def test_checks_write_nothing(tmp_path, mirror, more, run):
    result = run(args(tmp_path, mirror, **more))
    assert result["needed_bytes"] == 23 + 16384
    assert result["changed"] is ("_ansible_check_mode" in more)
    assert not (tmp_path / "weights").exists()


def test_no_room_fails_with_both_numbers_and_writes_nothing(tmp_path, mirror, run):
    result = run(args(tmp_path, mirror, reserve="1000T"), fails=True)
    assert f"needs {23 + 16384} bytes" in result["msg"]
    assert f"only {result['free_bytes']} bytes" in result["msg"]
    assert result["required_free_bytes"] > result["free_bytes"]
    assert not (tmp_path / "weights").exists()


def test_local_weights_are_checked_not_copied(tmp_path, mirror, run):
    local = {"kind": "local", "path": f"{mirror}/llmops/tiny"}
    result = run({"path": str(tmp_path / "unused"), "source": local})
    assert result["changed"] is False and result["path"] == local["path"] and result["total_bytes"] == 23 + 16384
    empty = {"kind": "local", "path": str(tmp_path)}
    assert "holds no config.json" in run({"path": str(tmp_path / "unused"), "source": empty}, fails=True)["msg"]


@pytest.mark.parametrize("hub_client", ["builtin", "auto"])
def test_the_hub_comes_from_hf_endpoint_by_either_client(tmp_path, hub, run, monkeypatch, hub_client):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    result = run(hub_args(tmp_path, hub_client=hub_client))
    assert result["fetch_client"]["name"] == ("builtin" if hub_client == "builtin" else "huggingface_hub")
    assert result["commit"] == hub.repos["me/model"].commit
    assert result["fetched_bytes"] == sum(len(data) for data in hub.files.values())
    for path, data in hub.files.items():
        assert (tmp_path / "weights" / "model" / path).read_bytes() == data
    assert run(hub_args(tmp_path, hub_client=hub_client))["changed"] is False


def test_an_interrupted_fetch_is_resumed_by_the_next_run(tmp_path, hub, run):
    hub.fail(SHARD, "cut", after=1 << 20)
    hub.fail(SHARD, "status", count=_weights_fetch.RETRIES, status=503)
    failed = run(hub_args(tmp_path, hub_endpoint=hub.endpoint, hub_client="builtin", workers=1), fails=True)
    assert "run again to resume" in failed["msg"] and SHARD in failed["missing"]
    dest = tmp_path / "weights" / "model"
    assert not (dest / SHARD).exists() and (dest / PARTIAL_DIR / SHARD).exists()
    planned = run(hub_args(tmp_path, hub_endpoint=hub.endpoint, state="check"))
    assert next(file for file in planned["files"] if file["path"] == SHARD)["action"] == "fetch"  # the library: whole

    resumed = run(hub_args(tmp_path, hub_endpoint=hub.endpoint, hub_client="builtin"))
    step = next(file for file in resumed["files"] if file["path"] == SHARD)
    assert (step["action"], step["offset"]) == ("resume", 1 << 20)
    assert resumed["fetched_bytes"] == resumed["needed_bytes"]
    assert hashlib.sha256((dest / SHARD).read_bytes()).hexdigest() == hashlib.sha256(hub.files[SHARD]).hexdigest()
    assert not (dest / PARTIAL_DIR).exists()


def test_the_library_path_in_check_mode_writes_nothing(tmp_path, hub, run):
    result = run(hub_args(tmp_path, hub_endpoint=hub.endpoint, _ansible_check_mode=True))
    assert result["changed"] is True and result["fetch_client"]["name"] == "huggingface_hub"
    assert not (tmp_path / "weights").exists()


def test_bad_input_changes_nothing(tmp_path, mirror, run):
    assert "reserve" in run(args(tmp_path, mirror, reserve="lots"), fails=True)["msg"]
    assert "must not be negative" in run(args(tmp_path, mirror, margin=-0.1), fails=True)["msg"]
    missing = run(args(tmp_path, str(tmp_path / "nowhere")), fails=True)
    assert "does not exist on this host" in missing["msg"]
    assert not (tmp_path / "weights").exists()
