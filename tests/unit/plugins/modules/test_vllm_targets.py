import json

import pytest
from ansible.module_utils import basic

from ansible_collections.llmops.vllm.plugins.modules import vllm_targets


def unit_show(active_state, unit_file_state, exec_start=""):
    return (
        f"LoadState=loaded\nActiveState={active_state}\nSubState=running\nMainPID=0\nUnitFileState={unit_file_state}\n"
        f"ExecStart={exec_start}\n"
    )


@pytest.fixture
def units(monkeypatch):
    """systemctl show answering for the units in the returned dict (name: (ActiveState, UnitFileState[, ExecStart])),
    and `not-found` for any other, as systemd answers."""
    states = {}

    def run_command(self, command, **_kwargs):
        assert command[:2] == ["systemctl", "show"], command
        if command[2] not in states:
            return 0, "LoadState=not-found\nActiveState=inactive\nSubState=dead\nMainPID=0\n", ""
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


def router_exec_start(*flags):
    argv = ["/opt/vllm-router/venv/bin/python", "/opt/vllm-router/launcher.py", "--", "--host", "0.0.0.0", "--port",
            "8080", *flags]  # fmt: skip
    return f"{{ path={argv[0]} ; argv[]={' '.join(argv)} ; ignore_errors=no ; start_time=[n/a] ; pid=0 }}"


@pytest.mark.parametrize(
    ("listen", "remote", "local"),
    [("0.0.0.0", ["10.0.0.12:29000"], ["127.0.0.1:29000"]), ("10.0.0.12", ["10.0.0.12:29000"], ["10.0.0.12:29000"]),
     ("127.0.0.1", [], ["127.0.0.1:29000"])],
)  # fmt: skip
def test_the_hosts_router_is_a_target_where_its_unit_serves_its_metrics(run, units, listen, remote, local):
    units["vllm-router.service"] = ("active", "enabled", router_exec_start("--prometheus-host", listen,
                                                                           "--prometheus-port", "29000"))  # fmt: skip
    result = run()
    assert result["router_targets"] == [
        {"targets": target, "labels": {"host": "gpu-01"}} for target in [remote] if target
    ]
    assert result["router_local_targets"] == [{"targets": local, "labels": {"host": "gpu-01"}}]


def test_no_router_or_one_that_systemd_is_not_to_run_is_no_target(run, units):
    assert run()["router_targets"] == run()["router_local_targets"] == []
    flags = ("--prometheus-host", "0.0.0.0", "--prometheus-port", "29000")
    units["vllm-router.service"] = ("inactive", "disabled", router_exec_start(*flags))
    assert run()["router_local_targets"] == []


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
