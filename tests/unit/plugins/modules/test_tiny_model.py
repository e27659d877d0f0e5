import json

import pytest

from ansible_collections.llmops.vllm.plugins.modules import tiny_model


@pytest.fixture
def run(run_module):
    return lambda args, fails=False: run_module(tiny_model.main, args, fails)


def test_writes_then_changes_nothing(run, tmp_path):
    path = str(tmp_path / "tiny")
    first = run({"path": path})
    assert first["changed"] is True
    assert first["config"]["hidden_size"] == 256
    assert set(first["files"]) >= {"config.json", "tokenizer.json", "model.safetensors"}
    second = run({"path": path})
    assert second["changed"] is False
    assert second["files"] == first["files"]


def test_check_mode_writes_nothing(run, tmp_path):
    path = tmp_path / "tiny"
    result = run({"path": str(path), "_ansible_check_mode": True})
    assert result["changed"] is True
    assert result["diff"]["before"] == {"params": None}
    assert not path.exists()


def test_changed_parameters_regenerate(run, tmp_path):
    path = str(tmp_path / "tiny")
    run({"path": path})
    result = run({"path": path, "seed": 7})
    assert result["changed"] is True
    assert result["diff"]["before"]["params"]["seed"] == 0
    assert json.loads((tmp_path / "tiny" / ".llmops-tiny-model.json").read_text())["params"]["seed"] == 7


def test_bad_shape_fails_and_writes_nothing(run, tmp_path):
    path = tmp_path / "tiny"
    result = run({"path": str(path), "hidden_size": 250}, fails=True)
    assert "hidden_size 250 is not divisible by num_attention_heads 4" in result["msg"]
    assert not path.exists()


def test_unknown_dtype_is_refused(run, tmp_path):
    result = run({"path": str(tmp_path), "dtype": "int4"}, fails=True)
    assert "dtype" in result["msg"]
