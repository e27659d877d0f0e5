import json

import pytest
from ansible.module_utils import basic

from ansible_collections.llmops.vllm.plugins.modules import vllm_targets


def unit_show(active_state, unit_file_state):
    return (
        f"LoadState=loaded\nActiveState={active_state}\nSubState=running\nMainPID=0\nUnitFileState={unit_file_state}\n"
    )


@pytest.fixture
def units(monkeypatch):
    """systemctl show answering for the units in the returned dict (name: (ActiveState, UnitFileState))."""
    states = {}

    def run_command(self, command, **_kwargs):
        assert command[:2] == ["systemctl", "show"], command
        return 0, unit_show(*states[command[2]]), ""

    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    return states


def write_record(config_dir, name, port, host="0.0.0.0", **fields):
    url_host = "127.0.0.1" if host == "0.0.0.0" else host
    record = {
        "instance": name, "unit": f"vllm-{name}.service", "model": fields.pop("model", name), "served_name": name,
        "host": host, "port": port, "url": f"http://{url_host}:{port}", "gpus": [0], "model_path": f"/m/{name}",
        "python": "/opt/vllm/venv/bin/python", "vllm_version": "0.32.0", "layout": {"tensor_parallel_size": 1},
        "load_timeout": 300, "drain_timeout": 10, "stop_timeout": 30,
        "secrets": {"environment_file": str(config_dir / f"{name}.env"), "api_key_variable": "VLLM_API_KEY"},
        **fields,
    }  # fmt: skip
    config_dir.mkdir(exist_ok=True)
    (config_dir / f"{name}.json").write_text(json.dumps(record))


@pytest.fixture
def run(run_module, tmp_path):
    def run(fails=False, check_mode=False, **args):
        args = {
            "config_dir": str(tmp_path / "vllm"),
            "host": "gpu-01",
            "address": "10.0.0.12",
            "readers_file": str(tmp_path / "vllm" / "metrics-readers"),
            "_ansible_check_mode": check_mode,
            **args,
        }
        return run_module(vllm_targets.main, args, fails)

    return run


def test_the_instances_that_systemd_is_to_run_are_the_targets(run, tmp_path, units):
    config_dir = tmp_path / "vllm"
    write_record(config_dir, "tiny2", 8000, model="tiny2")
    write_record(config_dir, "tiny", 8001)
    write_record(config_dir, "tiny-b", 8002, host="127.0.0.2")
    units.update({
        "vllm-tiny2.service": ("active", "enabled"),  # the swap's new instance
        "vllm-tiny.service": ("inactive", "disabled"),  # the one it replaced
        "vllm-tiny-b.service": ("activating", "enabled"),  # restarting after its engine died
    })  # fmt: skip
    result = run(metrics_readers=["10.0.0.5"])

    def labels(name):
        return {"host": "gpu-01", "vllm_instance": name, "model": name, "served_name": name, "gpus": "0",
                "vllm_version": "0.32.0"}  # fmt: skip

    assert result["targets"] == [{"targets": ["10.0.0.12:8000"], "labels": labels("tiny2")}]
    assert result["local_targets"] == [
        {"targets": ["127.0.0.2:8002"], "labels": labels("tiny-b")},
        {"targets": ["127.0.0.1:8000"], "labels": labels("tiny2")},
    ]
    assert result["local_only"] == ["tiny-b"]
    assert result["outdated"] == []


def test_the_readers_file_is_written_once_and_read_by_everyone(run, tmp_path, units):
    readers_file = tmp_path / "vllm" / "metrics-readers"
    predicted = run(check_mode=True, metrics_readers=["10.0.0.5", "10.1.0.0/16"])
    assert predicted["changed"] is True and not readers_file.exists()
    assert predicted["diff"]["after"].splitlines()[-2:] == ["10.0.0.5/32", "10.1.0.0/16"]
    written = run(metrics_readers=["10.0.0.5", "10.1.0.0/16"])
    assert written["changed"] is True and written["readers"] == ["10.0.0.5/32", "10.1.0.0/16"]
    assert readers_file.read_text().splitlines()[-2:] == ["10.0.0.5/32", "10.1.0.0/16"]
    assert readers_file.stat().st_mode & 0o777 == 0o644
    assert run(metrics_readers=["10.1.0.0/16", "10.0.0.5"])["changed"] is False
    # No readers: /metrics for the host itself alone, and the file says so.
    emptied = run()
    assert emptied["changed"] is True and emptied["readers"] == []
    assert all(line.startswith("#") for line in readers_file.read_text().splitlines())


def test_a_record_of_an_older_release_is_no_target_and_is_named(run, tmp_path, units):
    config_dir = tmp_path / "vllm"
    config_dir.mkdir()
    (config_dir / "old.json").write_text(json.dumps({"instance": "old", "unit": "vllm-old.service", "port": 8000}))
    units["vllm-old.service"] = ("active", "enabled")
    result = run()
    assert (result["targets"], result["outdated"]) == ([], ["old"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"metrics_readers": ["no-such-host.invalid"]}, "metrics reader 'no-such-host.invalid' is neither"),
        ({"address": " "}, "address must name the host"),
        ({"host": ""}, "host must name the host"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(run, tmp_path, units, args, message):
    result = run(fails=True, **args)
    assert message in result["msg"]
    assert not (tmp_path / "vllm").exists()
