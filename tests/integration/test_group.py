"""One model over the two hosts of the fleet: vLLM's own multi-node data parallel serving, deployed by deploy.yml
as one group (the catalog entry tiny_pair: a rank on each host, the first host's API server in front of both, the
second host headless), then stopped by stop.yml."""

import json
import re
import urllib.request
from pathlib import Path

import pytest

from .conftest import remove_instances, unfolded

CATALOG = str(Path(__file__).resolve().parent / "catalog")
ENTRY = "tiny_pair"
PORT = 8001
DEPLOY = ("-e", json.dumps({"vllm_instances": [{"model": ENTRY, "port": PORT}], "vllm_catalog_paths": [CATALOG]}))


def completion(url: str, key: str, rank: int) -> dict:
    """One token from the data parallel rank `rank`, asked through the group's API server."""
    body = json.dumps({"model": ENTRY, "prompt": "Hello", "max_tokens": 1, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"{url}/v1/completions",
        data=body,
        headers={
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "X-data-parallel-rank": str(rank),
        },
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def finished_by_engine(head) -> dict[str, float]:
    """vLLM's count of finished requests of each data parallel engine, from the API server's /metrics, which
    answers the host itself."""
    result = head.module("ansible.builtin.uri", url=f"http://127.0.0.1:{PORT}/metrics", return_content=True)
    assert not result.get("failed"), result
    text = result["content"]
    counts = {}
    for engine, value in re.findall(r'^vllm:request_success_total\{[^}]*engine="(\d+)"[^}]*\} (\S+)$', text, re.M):
        counts[engine] = counts.get(engine, 0.0) + float(value)
    return counts


def record(host, instance=ENTRY) -> dict:
    result = host.module("llmops.vllm.vllm_instance_info", config_dir=host.config_dir, instances=[instance])
    assert not result.get("failed"), result
    return result["instances"][0]


@pytest.fixture(scope="module")
def pair(fleet, tmp_path_factory):
    """The group deployed over both hosts by one deploy.yml; removed from both afterwards."""
    first, second = fleet.hosts
    inventory = fleet.inventory_with(
        tmp_path_factory.mktemp("group") / "hosts.yml", groups={ENTRY: {"hosts": {first.name: {}, second.name: {}}}}
    )
    deployed = fleet.playbook("playbooks/deploy.yml", *DEPLOY, inventory=inventory)
    yield inventory, deployed
    for host in fleet.hosts:
        remove_instances(host, ENTRY)


def test_one_deploy_makes_the_group_and_each_rank_computes(fleet, pair):
    first, second = fleet.hosts
    _inventory, deployed = pair
    output = unfolded(deployed)
    assert deployed.returncode == 0, output[output.find("fatal:") - 3000 :][:6000]
    head, worker = record(first), record(second)
    assert head["group"]["role"] == "head" and worker["group"]["role"] == "worker"
    assert worker["group"]["serves_api"] is False and worker["url"] == f"http://{first.address}:{PORT}"
    url = f"http://{first.address}:{PORT}"
    before = finished_by_engine(first)
    for rank in (0, 1):
        assert completion(url, first.api_key, rank)["choices"][0]["finish_reason"] in ("length", "stop")
    after = finished_by_engine(first)
    # Each rank's engine finished the request handed to it: the one on the second host too.
    assert {engine: after[engine] - before.get(engine, 0.0) for engine in after} == {"0": 1.0, "1": 1.0}


def test_the_worker_runs_headless_and_serves_no_port_of_its_own(fleet, pair):
    _first, second = fleet.hosts
    unit = second.sh(f"systemctl show -p ExecStart --value vllm-{ENTRY}.service").stdout
    assert "--headless" in unit and "--data-parallel-start-rank 1" in unit
    listening = second.sh(f"ss -Hltn 'sport = :{PORT}'").stdout
    assert listening.strip() == "", listening


def test_a_second_deploy_changes_nothing(fleet, pair):
    inventory, _deployed = pair
    again = fleet.playbook("playbooks/deploy.yml", *DEPLOY, inventory=inventory)
    output = unfolded(again)
    assert again.returncode == 0, output[-6000:]
    assert re.findall(r"changed=(\d+)", output) == ["0", "0"], output[-3000:]


def test_stop_ends_the_group_on_both_hosts(fleet, pair):
    inventory, _deployed = pair
    stopped = fleet.playbook("playbooks/stop.yml", "-e", f"instance={ENTRY}", inventory=inventory)
    assert stopped.returncode == 0, unfolded(stopped)[-6000:]
    for host in fleet.hosts:
        state = host.sh(f"systemctl show -p ActiveState --value vllm-{ENTRY}.service").stdout.strip()
        assert state in ("inactive", "failed"), (host.name, state)
