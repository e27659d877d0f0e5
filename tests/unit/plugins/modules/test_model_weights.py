"""The model_weights module end to end against a mirror on a local path (the HTTP paths are in test_weights)."""

import pytest

from ansible_collections.llmops.vllm.plugins.modules import model_weights


@pytest.fixture
def run(run_module):
    """`run(args)` returns the module's result; with `fails=True`, the result it failed with."""

    def run_model_weights(module_args, fails=False):
        return run_module(model_weights.main, module_args, fails=fails)

    return run_model_weights


@pytest.fixture
def mirror(tmp_path):
    model = tmp_path / "mirror" / "llmops" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    return str(tmp_path / "mirror")


def args(tmp_path, mirror, **more):
    return {
        "path": str(tmp_path / "weights" / "tiny"),
        "source": {"kind": "hub", "repo": "llmops/tiny"},
        "mirror": mirror,
        "reserve": "0",
        **more,
    }


def test_fetches_then_changes_nothing(tmp_path, mirror, run):
    first = run(args(tmp_path, mirror))
    assert first["changed"] is True
    assert first["fetched_bytes"] == first["needed_bytes"] == first["total_bytes"] == 23 + 16384
    assert (tmp_path / "weights" / "tiny" / "model.safetensors").read_bytes() == bytes(range(256)) * 64
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


def test_bad_input_changes_nothing(tmp_path, mirror, run):
    assert "reserve" in run(args(tmp_path, mirror, reserve="lots"), fails=True)["msg"]
    assert "must not be negative" in run(args(tmp_path, mirror, margin=-0.1), fails=True)["msg"]
    missing = run(args(tmp_path, str(tmp_path / "nowhere")), fails=True)
    assert "does not exist on this host" in missing["msg"]
    assert not (tmp_path / "weights").exists()


def test_local_weights_are_checked_not_copied(tmp_path, mirror, run):
    local = {"kind": "local", "path": f"{mirror}/llmops/tiny"}
    result = run({"path": str(tmp_path / "unused"), "source": local})
    assert result["changed"] is False and result["path"] == local["path"] and result["total_bytes"] == 23 + 16384
    empty = {"kind": "local", "path": str(tmp_path)}
    assert "holds no config.json" in run({"path": str(tmp_path / "unused"), "source": empty}, fails=True)["msg"]
