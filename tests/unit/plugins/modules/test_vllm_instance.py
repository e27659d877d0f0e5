import json
import os
import stat

import pytest

from ansible_collections.llmops.vllm.plugins.modules import vllm_instance

KEY = "sk-instance-key-3a9"
UNIT = "[Unit]\nDescription=vLLM serving tiny\n[Service]\nExecStart=/opt/vllm/venv/bin/python -m vllm\n"


@pytest.fixture
def args(tmp_path):
    return {
        "config_dir": str(tmp_path), "instance": "tiny", "unit": "vllm-tiny.service", "model": "tiny",
        "served_name": "tiny", "host": "127.0.0.2", "port": 8001, "gpus": [0, 1],
        "model_path": "/var/lib/vllm/models/tiny", "python": "/opt/vllm/venv/bin/python", "vllm_version": "0.32.0",
        "layout": {"tensor_parallel_size": 2}, "load_timeout": 300, "drain_timeout": 10, "stop_timeout": 30,
        "environment_file": str(tmp_path / "tiny.env"), "environment": {"HOME": "/var/lib/vllm", "HF_HUB_OFFLINE": "1"},
        "api_key": KEY, "unit_file": str(tmp_path / "vllm-tiny.service"), "unit_content": UNIT,
    }  # fmt: skip


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_writes_the_environment_the_unit_and_the_record_then_changes_nothing(run_module, tmp_path, args):
    first = run_module(vllm_instance.main, args)
    assert first["changed"] is True and first["changed_files"] == ["environment", "unit", "record"]
    assert (tmp_path / "tiny.env").read_text().splitlines()[1:] == [
        'HF_HUB_OFFLINE="1"',
        'HOME="/var/lib/vllm"',
        f'VLLM_API_KEY="{KEY}"',
    ]
    assert mode(tmp_path / "tiny.env") == 0o600 and mode(tmp_path / "vllm-tiny.service") == 0o644
    assert (tmp_path / "vllm-tiny.service").read_text() == UNIT
    record = json.loads((tmp_path / "tiny.json").read_text())
    assert record == first["record"] and record["url"] == "http://127.0.0.2:8001"
    assert KEY not in (tmp_path / "tiny.json").read_text() and KEY not in json.dumps(first)
    again = run_module(vllm_instance.main, args)
    assert again["changed"] is False and again["changed_files"] == [] and again["diff"] == []


def test_a_new_key_changes_the_environment_alone_and_the_diff_hides_it(run_module, tmp_path, args):
    run_module(vllm_instance.main, args)
    result = run_module(vllm_instance.main, {**args, "api_key": "sk-rotated-key-5d2"})
    assert result["changed_files"] == ["environment"]
    assert "sk-rotated" not in json.dumps(result["diff"]) and KEY not in json.dumps(result["diff"])


def test_a_loosened_mode_is_put_back(run_module, tmp_path, args):
    run_module(vllm_instance.main, args)
    os.chmod(tmp_path / "tiny.env", 0o644)
    assert run_module(vllm_instance.main, args)["changed_files"] == ["environment"]
    assert mode(tmp_path / "tiny.env") == 0o600


def test_the_records_directory_is_created(run_module, tmp_path, args):
    config_dir = tmp_path / "vllm"
    result = run_module(
        vllm_instance.main, {**args, "config_dir": str(config_dir), "environment_file": str(config_dir / "tiny.env")}
    )
    assert result["changed_files"] == ["environment", "unit", "record"]
    assert mode(config_dir) == 0o755 and sorted(entry.name for entry in config_dir.iterdir()) == [
        "tiny.env",
        "tiny.json",
    ]


def test_check_mode_predicts_and_writes_nothing(run_module, tmp_path, args):
    args = {**args, "config_dir": str(tmp_path / "vllm"), "environment_file": str(tmp_path / "vllm" / "tiny.env")}
    result = run_module(vllm_instance.main, {**args, "_ansible_check_mode": True})
    assert result["changed_files"] == ["environment", "unit", "record"]
    assert result["diff"][1] == {"before_header": args["unit_file"], "after_header": args["unit_file"],
                                 "before": "", "after": UNIT}  # fmt: skip
    assert list(tmp_path.iterdir()) == []
