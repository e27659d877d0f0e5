import json

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.llmops.vllm.plugins.modules import tiny_model


class ModuleExit(Exception):
    pass


class ModuleFail(Exception):
    pass


@pytest.fixture(autouse=True)
def exits(monkeypatch):
    def exit_json(self, **result):
        raise ModuleExit(result)

    def fail_json(self, **result):
        raise ModuleFail(result)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)


def run(args, outcome=ModuleExit):
    with patch_module_args(args), pytest.raises(outcome) as raised:
        tiny_model.main()
    return raised.value.args[0]


def test_writes_then_changes_nothing(tmp_path):
    path = str(tmp_path / "tiny")
    first = run({"path": path})
    assert first["changed"] is True
    assert first["config"]["hidden_size"] == 256
    assert set(first["files"]) >= {"config.json", "tokenizer.json", "model.safetensors"}
    second = run({"path": path})
    assert second["changed"] is False
    assert second["files"] == first["files"]


def test_check_mode_writes_nothing(tmp_path):
    path = tmp_path / "tiny"
    result = run({"path": str(path), "_ansible_check_mode": True})
    assert result["changed"] is True
    assert result["diff"]["before"] == {"params": None}
    assert not path.exists()


def test_changed_parameters_regenerate(tmp_path):
    path = str(tmp_path / "tiny")
    run({"path": path})
    result = run({"path": path, "seed": 7})
    assert result["changed"] is True
    assert result["diff"]["before"]["params"]["seed"] == 0
    assert json.loads((tmp_path / "tiny" / ".llmops-tiny-model.json").read_text())["params"]["seed"] == 7


def test_bad_shape_fails_and_writes_nothing(tmp_path):
    path = tmp_path / "tiny"
    result = run({"path": str(path), "hidden_size": 250}, outcome=ModuleFail)
    assert "hidden_size 250 is not divisible by num_attention_heads 4" in result["msg"]
    assert not path.exists()


def test_unknown_dtype_is_refused(tmp_path):
    result = run({"path": str(tmp_path), "dtype": "int4"}, outcome=ModuleFail)
    assert "dtype" in result["msg"]
