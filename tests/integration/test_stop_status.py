"""A second instance beside tiny on the second host, then bench.yml of it by name, status.yml and stop.yml of it.

The second host keeps its records in a directory of its own and listens on its own address: bench.yml, status.yml
and stop.yml find the instance, its port (8001, not the default) and its key through its record alone.
"""

import json
import re

import pytest

from .conftest import remove_instances

INSTANCES = [{"model": "tiny"}, {"name": "tiny-b", "model": "tiny", "port": 8001}]


@pytest.fixture(scope="module")
def second(fleet):
    """tiny-b beside tiny on the second host, deployed by deploy.yml with tiny's own key; removed afterwards."""
    host = fleet.hosts[1]
    proc = host.playbook("playbooks/deploy.yml", "-e", json.dumps({"vllm_instances": INSTANCES}))
    assert proc.returncode == 0, f"deploy.yml failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    yield host
    remove_instances(host, "tiny-b")


def running(host):
    result = host.module("llmops.vllm.vllm_instance_info", config_dir=host.config_dir, metrics=False)
    assert not result.get("failed"), result
    return {record["instance"]: record for record in result["instances"] if record["active_state"] == "active"}


def test_both_instances_serve_tiny_at_their_records_urls_on_the_hosts_address(second):
    serving = running(second)
    assert {name: record["url"] for name, record in serving.items()} == {
        "tiny": second.endpoint,
        "tiny-b": second.endpoint.replace(":8000", ":8001"),
    }
    for record in serving.values():
        answer = second.module("ansible.builtin.uri", url=record["url"] + "/v1/models",
                               headers={"Authorization": f"Bearer {second.api_key}"})  # fmt: skip
        assert [model["id"] for model in answer["json"]["data"]] == ["tiny"]


def test_bench_yml_measures_the_instance_it_names_on_its_own_port(second, tmp_path):
    workload = {"vllm_bench_concurrency": [1], "vllm_bench_num_requests": 4, "vllm_bench_input_len": 16,
                "vllm_bench_output_len": 8, "vllm_bench_report_formats": ["json"],
                "vllm_bench_report_dir": str(tmp_path)}  # fmt: skip
    proc = second.playbook("playbooks/bench.yml", "-e", "instance=tiny-b", "-e", json.dumps(workload))
    assert proc.returncode == 0, proc.stdout[-4000:]
    saved = json.loads((tmp_path / f"{second.name}.json").read_text())
    assert saved["summary"]["model"] == "tiny"
    assert [(level["completed"], level["failed"]) for level in saved["levels"]] == [(4, 0)]


def test_status_yml_shows_every_instance_of_the_fleet(fleet, second):
    proc = fleet.playbook("playbooks/status.yml")
    assert proc.returncode == 0, proc.stdout[-4000:]
    for host, instance, port in (
        (second.name, "tiny-b", 8001),
        (second.name, "tiny", 8000),
        (fleet.hosts[0].name, "tiny", 8000),
    ):
        assert re.search(rf"{host} +\| {instance} +\| tiny +\| +{port} \| active ", proc.stdout), proc.stdout[-4000:]


def test_stop_yml_stops_the_instance_it_names_and_leaves_the_other_serving(second):
    tiny_pid = second.sh("systemctl show -p MainPID --value vllm-tiny.service").stdout.strip()
    proc = second.playbook("playbooks/stop.yml", "-e", "instance=tiny-b")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert re.search(r"tiny-b. vllm-tiny-b.service. stopped in", proc.stdout), proc.stdout[-4000:]
    states = second.module("llmops.vllm.vllm_instance_info", config_dir=second.config_dir, metrics=False)["instances"]
    states = {record["instance"]: (record["active_state"], record["enabled"]) for record in states}
    assert states["tiny-b"] == ("inactive", False)
    assert states["tiny"] == ("active", True)
    assert second.sh("systemctl show -p MainPID --value vllm-tiny.service").stdout.strip() == tiny_pid
