"""rollout.yml across the two hosts of the fleet, in batches of one, giving the new model a new API key.

The second host cannot load tiny2 in time (its catalog gives it a load timeout of 5 s): it rolls back to tiny with
tiny's own key, from its own records directory, at its own address, while the first swaps and answers to the new
key alone. The summary says so and the run fails. The first host goes back to tiny afterwards with swap.yml.
The gate is off here (vllm_rollout_gate=false): test_gate.py rolls a regression out on purpose.
"""

import json
import re
from pathlib import Path

import pytest

from .conftest import unfolded

SLOW_CATALOG = str(Path(__file__).resolve().parent / "slow-catalog")
ROTATED_KEY = "integration-rotated-key-2b7d"


def models_served(host, url, key):
    """(HTTP status, the models listed) of GET URL/v1/models from the host itself, with `key`."""
    result = host.module("ansible.builtin.uri", url=f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"},
                         status_code=[200, 401])  # fmt: skip
    assert not result.get("failed"), result
    return result["status"], [model["id"] for model in (result.get("json") or {}).get("data", [])]


def instances(host, metrics=False):
    result = host.module("llmops.vllm.vllm_instance_info", config_dir=host.config_dir, metrics=metrics)
    assert not result.get("failed"), result
    return {record["instance"]: record for record in result["instances"]}


@pytest.fixture(scope="module")
def rollout(fleet, tmp_path_factory):
    """The rollout's run; afterwards the first host serves tiny again, through swap.yml."""
    first, second = fleet.hosts
    inventory = fleet.inventory_with(
        tmp_path_factory.mktemp("rollout") / "hosts.yml", **{second.name: {"vllm_catalog_paths": [SLOW_CATALOG]}}
    )
    proc = fleet.playbook(
        "playbooks/rollout.yml", "-e", "model=tiny2", "-e", "vllm_rollout_max_fail_percentage=50",
        "-e", "vllm_rollout_gate=false", "-e", f"vllm_server_api_key={ROTATED_KEY}", inventory=inventory,
    )  # fmt: skip
    yield proc
    back = first.playbook("playbooks/swap.yml", "-e", "model=tiny")
    assert back.returncode == 0, back.stdout[-4000:]
    assert re.search(r"swapped in [0-9.]+ s \(tiny2 -> tiny\)", back.stdout), back.stdout[-4000:]


def test_the_summary_says_which_host_swapped_and_which_rolled_back(fleet, rollout):
    first, second = fleet.hosts
    output = unfolded(rollout)
    assert rollout.returncode == 2, output[-6000:]
    assert re.search(rf"{first.name} +\| tiny +\| tiny2 +\| [0-9.]+ +\| swapped ", output), output[-6000:]
    assert re.search(rf"{second.name} +\| tiny +\| tiny2 +\| [0-9.]+ +\| rolled back ", output), output[-6000:]
    # The failure of the second host names the gate that failed and what serves now.
    assert "rolled back: Start the new instance and wait until it serves tiny2" in output
    assert "rolled back, tiny serves again" in output


def test_the_swapped_host_answers_to_the_new_key_alone(fleet, rollout):
    first = fleet.hosts[0]
    assert models_served(first, first.endpoint, ROTATED_KEY) == (200, ["tiny2"])
    assert models_served(first, first.endpoint, first.api_key)[0] == 401
    states = instances(first)
    assert (states["tiny2"]["active_state"], states["tiny2"]["enabled"]) == ("active", True)
    assert (states["tiny"]["active_state"], states["tiny"]["enabled"]) == ("inactive", False)


def test_the_host_that_rolled_back_serves_tiny_with_its_own_key_from_its_own_records(fleet, rollout):
    second = fleet.hosts[1]
    states = instances(second)
    # Its records lie in its own directory, and the rollback waited at the record's URL, not at 127.0.0.1.
    assert states["tiny"]["url"] == second.endpoint
    assert (states["tiny"]["active_state"], states["tiny"]["enabled"]) == ("active", True)
    # tiny2 never served: its unit stays stopped, and will not start at boot. Its start failed, but the rollback
    # reset the failed state, so the host does not read `degraded` for it.
    assert (states["tiny2"]["active_state"], states["tiny2"]["enabled"]) == ("inactive", False)
    assert second.sh("systemctl is-failed vllm-tiny2.service", check=False).stdout.strip() == "inactive"
    assert models_served(second, second.endpoint, second.api_key) == (200, ["tiny"])
    assert models_served(second, second.endpoint, ROTATED_KEY)[0] == 401
    # A swap leaves the old model's weights in place; the second host keeps the tiny2 it fetched for nothing.
    assert sorted(second.sh("ls /var/lib/vllm/models").stdout.split()) == ["tiny", "tiny2"]
    assert {"tiny", "tiny2"} <= set(fleet.hosts[0].sh("ls /var/lib/vllm/models").stdout.split())
    assert json.loads(second.sh(f"cat {second.config_dir}/tiny2.json").stdout)["url"] == second.endpoint
