import json
import os

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.common.file_writer import write_if_changed
from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import (
    FIELDS,
    RECORD_MODE,
    RecordError,
    api_key,
    build_record,
    find,
    group_url,
    local_url,
    read_record,
    record_path,
    record_text,
    remote_url,
)


def fields(**changes):
    """The fields that the vllm_server role gives the record of an instance."""
    return {
        "instance": "tiny",
        "unit": "vllm-tiny.service",
        "model": "tiny",
        "served_name": "tiny",
        "host": "0.0.0.0",
        "port": 8000,
        "gpus": [],
        "model_path": "/var/lib/vllm/models/tiny",
        "python": "/opt/vllm/venv/bin/python",
        "vllm_version": "0.32.0",
        "layout": {"tensor_parallel_size": 1},
        "load_timeout": 300,
        "drain_timeout": 10,
        "stop_timeout": 30,
        "secrets": {"environment_file": "/etc/vllm/tiny.env", "api_key_variable": "VLLM_API_KEY"},
        **changes,
    }


@pytest.mark.parametrize(
    ("host", "port", "url"),
    [
        ("0.0.0.0", 8000, "http://127.0.0.1:8000"),
        ("::", 8001, "http://127.0.0.1:8001"),
        ("127.0.0.2", 8000, "http://127.0.0.2:8000"),
        ("10.1.2.3", 9000, "http://10.1.2.3:9000"),
        ("fd00::5", 8000, "http://[fd00::5]:8000"),
        ("gpu-07.lab", 8000, "http://gpu-07.lab:8000"),
    ],
)
def test_the_url_is_where_the_server_listens_or_loopback_for_a_wildcard(host, port, url):
    assert local_url(host, port) == url
    assert build_record(fields(host=host, port=port))["url"] == url


def test_a_client_elsewhere_reaches_the_record_s_port_through_the_host_s_address():
    record = build_record(fields(port=8001))
    assert remote_url(record, "192.0.2.7") == "http://192.0.2.7:8001"
    assert remote_url(record, "2001:db8::1") == "http://[2001:db8::1]:8001"


def test_the_record_names_where_the_key_lives_and_holds_no_secret():
    record = build_record(fields())
    assert sorted(record) == sorted(FIELDS)
    assert record["secrets"] == {"environment_file": "/etc/vllm/tiny.env", "api_key_variable": "VLLM_API_KEY"}
    assert (record["load_timeout"], record["drain_timeout"], record["stop_timeout"]) == (300, 10, 30)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"port": 0}, "has port 0, not a port number"),
        ({"port": True}, "has port True, not a port number"),
        ({"gpus": [0, -1]}, "has gpus [0, -1], not a list of GPU indices"),
        ({"load_timeout": 0}, "has load_timeout 0, not a number of seconds of at least 1"),
        ({"drain_timeout": -5}, "has drain_timeout -5, not a number of seconds of at least 0"),
        ({"served_name": " "}, "has served_name ' ', not a non-empty text"),
        ({"secrets": {"environment_file": "tiny.env", "api_key_variable": "K"}}, "has secrets {'environment_file'"),
        ({"vllm_version": None}, "has vllm_version None, not a non-empty text"),
    ],
)
def test_a_record_that_could_not_be_used_is_refused_before_it_is_written(changes, problem):
    with pytest.raises(RecordError, match="^The record of instance 'tiny' .*" + problem.replace("[", r"\[")):
        build_record(fields(**changes))


def test_writing_is_atomic_and_changes_nothing_the_second_time(tmp_path, ansible_module):
    path = record_path(str(tmp_path), "tiny")
    record = build_record(fields())
    module = ansible_module()
    assert write_if_changed(module, path, record_text(record), RECORD_MODE) is True
    before = os.stat(path)
    assert write_if_changed(module, path, record_text(record), RECORD_MODE) is False
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns
    assert oct(before.st_mode & 0o777) == "0o644"
    assert [entry.name for entry in tmp_path.iterdir()] == ["tiny.json"]
    assert read_record(path) == {**record, "outdated": []}
    assert json.loads(record_text(record)) == record


def test_the_key_comes_from_the_environment_file_the_record_names(tmp_path):
    env_file = tmp_path / "old.env"
    env_file.write_text('HOME="/var/lib/vllm"\nVLLM_API_KEY="old-key-\\$1"\n')
    record = build_record(
        fields(instance="old", secrets={"environment_file": str(env_file), "api_key_variable": "VLLM_API_KEY"})
    )
    assert api_key(record) == "old-key-$1"
    env_file.write_text('HOME="/var/lib/vllm"\n')
    assert api_key(record) is None


def test_an_unreadable_environment_file_is_named(tmp_path):
    record = build_record(fields(secrets={"environment_file": str(tmp_path / "gone.env"), "api_key_variable": "K"}))
    with pytest.raises(
        RecordError, match=rf"^Cannot read {tmp_path / 'gone.env'}, the EnvironmentFile of instance tiny: "
    ):
        api_key(record)


def test_an_outdated_record_is_found_but_not_acted_on(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps({"instance": "old", "unit": "vllm-old.service", "port": 8000}))
    with pytest.raises(RecordError, match=r"written by an older release of llmops\.vllm and lacks model, served_name,"):
        find(str(tmp_path), "old")
    with pytest.raises(RecordError, match="No instance record for new in"):
        find(str(tmp_path), "new")


def group_member(role, serves_api):
    return {"role": role, "hosts": ["host-a", "host-b"], "head": {"name": "host-a", "address": "10.0.0.1"},
            "serves_api": serves_api, "data_parallel_size": 2}  # fmt: skip


def test_a_headless_member_of_a_group_is_reached_at_the_head():
    assert group_url("0.0.0.0", 8000, {}) == "http://127.0.0.1:8000"
    assert group_url("0.0.0.0", 8000, group_member("head", True)) == "http://127.0.0.1:8000"
    assert group_url("10.0.0.2", 8000, group_member("worker", False)) == "http://10.0.0.1:8000"
    worker = build_record(fields(host="10.0.0.2", group=group_member("worker", False)))
    assert worker["url"] == "http://10.0.0.1:8000" and worker["group"]["role"] == "worker"


@pytest.mark.parametrize(
    "group",
    [
        {"role": "leader"},
        {**group_member("head", True), "hosts": ["host-a"]},
        {**group_member("head", True), "head": {}},
    ],
)
def test_a_group_that_is_not_a_member_s_part_is_refused(group):
    with pytest.raises(RecordError, match=r"has group .*, not \{\} or a group member"):
        build_record(fields(group=group))
