import builtins
import json
import socket
import time
from pathlib import Path

import pytest
from ansible.module_utils import basic

from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import FIX
from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import parse_show
from ansible_collections.llmops.vllm.plugins.modules import vllm_instance_info

# /metrics of a server with two engines (data parallelism), each with its own label set.
METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 4.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 1.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.625
"""
SECRET = "sk-never-read-this"
JOURNAL = (Path(__file__).parents[2] / "fixtures" / "journal" / "engine-deaths.json").read_text()


@pytest.fixture
def closed_port():
    """A port on which nothing listens: taken from the kernel, then let go."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def show(active_state, sub_state="running", main_pid=4242, active_since_us=0, unit_file_state="enabled", load="loaded"):
    return (
        f"LoadState={load}\nActiveState={active_state}\nSubState={sub_state}\nMainPID={main_pid}\n"
        f"UnitFileState={unit_file_state}\nActiveEnterTimestampMonotonic={active_since_us}\n"
    )


@pytest.fixture
def systemctl(monkeypatch):
    """systemctl answering `show` for the units in `units` (name: its show output), journalctl answering with
    the JSON lines in `journals` (name: text; rc 1, nothing matched, for the others); logs the commands."""
    units, commands, journals = {}, [], {}

    def run_command(self, command, **_kwargs):
        commands.append(command)
        if command[:2] == ["journalctl", "--unit"]:
            return (0, journals[command[2]], "") if command[2] in journals else (1, "", "")
        assert command[:2] == ["systemctl", "show"] and command[3] == "-p"
        return 0, units.get(command[2], show("inactive", "dead", 0, load="not-found", unit_file_state="")), ""

    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    return units, commands, journals


def write_record(config_dir, name, port, file_name=None, **fields):
    record = {
        "instance": name,
        "unit": f"vllm-{name}.service",
        "model": name,
        "served_name": name,
        "host": "0.0.0.0",
        "port": port,
        "url": f"http://127.0.0.1:{port}",
        "gpus": [],
        "model_path": f"/var/lib/vllm/models/{name}",
        "python": "/opt/vllm/venv/bin/python",
        "vllm_version": "0.32.0",
        "layout": {"tensor_parallel_size": 1},
        "load_timeout": 300,
        "drain_timeout": 10,
        "stop_timeout": 30,
        "secrets": {"environment_file": str(config_dir / f"{name}.env"), "api_key_variable": "VLLM_API_KEY"},
        **fields,
    }
    config_dir.mkdir(exist_ok=True)
    (config_dir / f"{file_name or name}.json").write_text(json.dumps(record))
    (config_dir / f"{name}.env").write_text(f"VLLM_API_KEY={SECRET}\n")
    return record


def good_record_text(**changes):
    """A record that reads back, with some fields changed or (value None) left out."""
    record = {
        "instance": "bad", "unit": "vllm-bad.service", "model": "bad", "served_name": "bad", "host": "0.0.0.0",
        "port": 8000, "url": "http://127.0.0.1:8000", "gpus": [], "model_path": "/m", "python": "/p/python",
        "vllm_version": "0.32.0", "layout": {}, "load_timeout": 300, "drain_timeout": 10, "stop_timeout": 30,
        "secrets": {"environment_file": "/etc/vllm/bad.env", "api_key_variable": "VLLM_API_KEY"},
    }  # fmt: skip
    record.update(changes)
    return json.dumps({key: value for key, value in record.items() if value is not None})


@pytest.fixture
def run(run_module, tmp_path):
    def run(args=None, fails=False):
        return run_module(vllm_instance_info.main, {"config_dir": str(tmp_path / "vllm"), **(args or {})}, fails)

    return run


def port_of(url):
    return int(url.rsplit(":", 1)[1])


def test_an_active_instance_with_its_metrics(run, tmp_path, systemctl, serve):
    url, asked = serve({"/health": (200, ""), "/metrics": (200, METRICS)})
    record = write_record(tmp_path / "vllm", "tiny", port_of(url), gpus=[0, 1])
    units, commands, _journals = systemctl
    units["vllm-tiny.service"] = show("active", active_since_us=int((time.monotonic() - 30) * 1e6))
    result = run()
    assert result["changed"] is False
    [tiny] = result["instances"]
    uptime = tiny.pop("uptime")
    assert 30 <= uptime < 60
    assert tiny == {
        **record,
        "sleep_mode": False,  # a record written before sleep mode reads as without it
        "group": {},  # and one written before groups as a one-host instance
        "outdated": [],
        "active_state": "active",
        "sub_state": "running",
        "enabled": True,
        "main_pid": 4242,
        "restarts": 0,
        "engine_death": None,
        "serving": True,
        "asleep": None,
        "requests_running": 5,
        "requests_waiting": 5,
        "kv_cache_usage": 0.625,
    }
    assert sorted(asked) == ["/health", "/metrics"]
    assert commands[0][:3] == ["systemctl", "show", "vllm-tiny.service"]
    assert {"UnitFileState", "ActiveEnterTimestampMonotonic"} <= set(commands[0][4].split(","))


def test_uptime_from_the_monotonic_timestamp():
    active = parse_show("u.service", show("active", active_since_us=874_500_000))
    assert vllm_instance_info.uptime(active, now=1000.04) == 125.5
    # Just entered: the clocks are read apart, so a few microseconds ahead is zero, not negative.
    assert vllm_instance_info.uptime(active, now=874.49999) == 0.0
    assert vllm_instance_info.uptime(parse_show("u.service", show("activating", active_since_us=5)), 10.0) is None
    assert vllm_instance_info.uptime(parse_show("u.service", show("active", active_since_us=0)), 10.0) is None


def test_an_inactive_instance_is_not_asked_over_http(run, tmp_path, systemctl, serve):
    url, asked = serve({"/health": (200, ""), "/metrics": (200, METRICS)})
    write_record(tmp_path / "vllm", "tiny", port_of(url))
    systemctl[0]["vllm-tiny.service"] = show("failed", "failed", main_pid=0, active_since_us=5_000_000)
    # A worker killed by SIGILL; the unit did not come back.
    systemctl[2]["vllm-tiny.service"] = "\n".join(JOURNAL.splitlines()[-7:])
    [tiny] = run()["instances"]
    assert (tiny["active_state"], tiny["sub_state"], tiny["main_pid"], tiny["uptime"]) == ("failed", "failed", 0, None)
    assert tiny["engine_death"] == "the engine died: Worker proc VllmWorker-0 died unexpectedly (exit code: -4, SIGILL)"
    assert [tiny[key] for key in vllm_instance_info.NOT_ASKED] == [None] * 5
    assert asked == []


def test_metrics_false_reads_only_systemd(run, tmp_path, systemctl, serve):
    url, asked = serve({"/health": (200, ""), "/metrics": (200, METRICS)})
    write_record(tmp_path / "vllm", "tiny", port_of(url))
    systemctl[0]["vllm-tiny.service"] = show("active", active_since_us=1, unit_file_state="disabled")
    [tiny] = run({"metrics": False})["instances"]
    assert tiny["active_state"] == "active" and tiny["enabled"] is False and tiny["serving"] is None
    assert asked == []


def test_a_record_whose_unit_is_gone(run, tmp_path, systemctl):
    write_record(tmp_path / "vllm", "old", 8001)
    [old] = run()["instances"]
    assert (old["active_state"], old["enabled"], old["uptime"], old["serving"]) == ("not-found", False, None, None)


def test_a_loading_server_and_a_silent_one(run, tmp_path, systemctl, serve, closed_port, monkeypatch):
    # /health answers 503 while the engine starts; /metrics may already answer without the engine's metrics.
    url, asked = serve({"/health": (503, ""), "/metrics": (200, "# no engine yet\n")})
    write_record(tmp_path / "vllm", "loading", port_of(url))
    write_record(tmp_path / "vllm", "silent", closed_port)
    systemctl[0]["vllm-loading.service"] = systemctl[0]["vllm-silent.service"] = show("active", active_since_us=1)
    asked_silent = []

    def get(url, path, **kwargs):
        if url.endswith(f":{closed_port}"):
            asked_silent.append(path)
        return real_get(url, path, **kwargs)

    real_get = vllm_instance_info.get
    monkeypatch.setattr(vllm_instance_info, "get", get)
    loading, silent = run({"timeout": 1})["instances"]
    assert loading["serving"] is False and loading["requests_running"] is None and loading["kv_cache_usage"] is None
    assert asked == ["/health", "/metrics"]
    assert silent["instance"] == "silent" and silent["serving"] is False and silent["requests_waiting"] is None
    assert asked_silent == ["/health"]  # no answer there: /metrics is not asked to wait out the timeout again


def test_instances_are_sorted_and_filtered_and_secrets_never_opened(run, tmp_path, systemctl, monkeypatch):
    # File names that sort otherwise than the instances: the order is the instances'.
    for name, port, file_name in (("zeta", 8002, "a"), ("alpha", 8001, "c"), ("mid", 8003, "b")):
        write_record(tmp_path / "vllm", name, port, file_name)
    opened = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *a, **kw: opened.append(str(path)) or real_open(path, *a, **kw))
    everything = run({"metrics": False})
    monkeypatch.setattr(builtins, "open", real_open)
    assert [instance["instance"] for instance in everything["instances"]] == ["alpha", "mid", "zeta"]
    assert [path for path in opened if path.startswith(str(tmp_path))] == [
        str(tmp_path / "vllm" / f"{file_name}.json") for file_name in ("a", "b", "c")
    ]
    assert SECRET not in json.dumps(everything)
    chosen = run({"instances": ["zeta", "alpha"], "metrics": False})
    assert [instance["instance"] for instance in chosen["instances"]] == ["alpha", "zeta"]


def test_an_unknown_instance_fails_listing_the_known_ones(run, tmp_path, systemctl):
    write_record(tmp_path / "vllm", "tiny", 8000)
    write_record(tmp_path / "vllm", "big", 8001)
    result = run({"instances": ["tiny", "huge"]}, fails=True)
    assert result["msg"] == f"No instance record for huge in {tmp_path / 'vllm'}; the instances here are: big, tiny"
    assert systemctl[1] == []


def test_a_missing_config_dir_is_a_host_without_instances(run, systemctl):
    assert run() == {"changed": False, "instances": []}
    assert "the instances here are: none" in run({"instances": ["tiny"]}, fails=True)["msg"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"instance": "bad", "unit": ', "is not valid JSON (Expecting value: line 1 column 29"),
        ('["bad"]', "holds a list, not an object"),
        (good_record_text(unit=None), "lacks unit;"),
        (good_record_text(instance=None, port=None), "lacks instance, port;"),
        (good_record_text(port="8000"), "has port '8000', not a port number"),
        (good_record_text(instance=""), "has instance '', not a non-empty text"),
        (good_record_text(url="127.0.0.1:8000"), "has url '127.0.0.1:8000', not a base URL such as http://"),
        (good_record_text(gpus=["0"]), "has gpus ['0'], not a list of GPU indices"),
        (good_record_text(load_timeout=-1), "has load_timeout -1, not a number of seconds of at least 1"),
        (good_record_text(secrets={"api_key": "sk-1"}), "has secrets {'api_key': 'sk-1'}, not {environment_file:"),
    ],
)
def test_a_bad_record_fails_naming_the_file(run, tmp_path, systemctl, text, problem):
    write_record(tmp_path / "vllm", "tiny", 8000)
    (tmp_path / "vllm" / "bad.json").write_text(text)
    # The bad record fails the module even when only another instance is asked for.
    result = run({"instances": ["tiny"]}, fails=True)
    assert result["msg"].startswith(f"The instance record {tmp_path / 'vllm' / 'bad.json'} ")
    assert problem in result["msg"]
    assert result["msg"].endswith(f"; {FIX}")


def test_a_record_of_an_older_release_is_listed_with_what_it_lacks(run, tmp_path, systemctl):
    # Before the record held its timeouts and where its key is: enough to list it and to check clashes with it.
    (tmp_path / "vllm").mkdir()
    old = {"instance": "old", "unit": "vllm-old.service", "model": "old", "served_name": "old", "port": 8000,
           "url": "http://127.0.0.1:8000", "gpus": [], "model_path": "/m", "vllm_version": "0.31.0",
           "layout": {}}  # fmt: skip
    (tmp_path / "vllm" / "old.json").write_text(json.dumps(old))
    [listed] = run({"metrics": False})["instances"]
    assert listed["outdated"] == ["host", "python", "secrets", "load_timeout", "drain_timeout", "stop_timeout"]
    assert {key: listed[key] for key in old} == old


def test_two_records_of_one_instance_fail(run, tmp_path, systemctl):
    write_record(tmp_path / "vllm", "tiny", 8000)
    (tmp_path / "vllm" / "tiny-copy.json").write_text(good_record_text(instance="tiny"))
    result = run(fails=True)
    assert result["msg"] == (
        f"The instance records {tmp_path / 'vllm' / 'tiny-copy.json'} and {tmp_path / 'vllm' / 'tiny.json'} "
        "both name instance tiny"
    )


def test_timeout_must_be_positive(run):
    assert run({"timeout": 0}, fails=True)["msg"] == "timeout must be more than 0 seconds, got 0.0"


def test_a_failing_systemctl_fails_the_module(run, tmp_path, monkeypatch):
    write_record(tmp_path / "vllm", "tiny", 8000)
    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, command, **_kw: (1, "", "Access denied"))
    result = run(fails=True)
    assert result["msg"].startswith("Reading the state of a vLLM unit failed: systemctl show vllm-tiny.service -p ")
    assert result["msg"].endswith("failed (rc 1): Access denied")


def test_metric_fields_sum_requests_and_take_the_fullest_cache():
    assert vllm_instance_info.metric_fields(METRICS) == {
        "requests_running": 5,
        "requests_waiting": 5,
        "kv_cache_usage": 0.625,
    }
    assert vllm_instance_info.metric_fields("vllm:num_requests_running NaN\n") == {
        "requests_running": None,
        "requests_waiting": None,
        "kv_cache_usage": None,
    }


def test_a_sleeping_instance_is_active_but_not_serving(run, tmp_path, systemctl, serve):
    url, asked = serve(
        {"/health": (200, ""), "/metrics": (200, METRICS), "/is_sleeping": (200, '{"is_sleeping":true}')}
    )
    write_record(tmp_path / "vllm", "kimi", port_of(url), sleep_mode=True)
    units, _commands, _journals = systemctl
    units["vllm-kimi.service"] = show("active", active_since_us=int((time.monotonic() - 30) * 1e6))
    [kimi] = run()["instances"]
    assert (kimi["sleep_mode"], kimi["asleep"], kimi["serving"]) == (True, True, False)
    assert "/is_sleeping" in asked
