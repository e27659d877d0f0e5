"""The gate on the two hosts of the fleet, with the real CPU vLLM on both.

Neutral: llmops.vllm.vllm_gate from the controller, tiny on the first host against tiny on the second, the same
settings: it must never answer regress. On purpose: rollout.yml to tiny_narrow (tiny batching at most two
sequences, which costs most of tiny's output tokens per second at the gate's concurrency), in batches of one; the
first host's gate measures it against the second host's tiny, which has not switched over yet, answers regress and
rolls the first host back, and the spent failure budget leaves the second host alone. The interval that the gate
reports must bracket the cost measured beforehand (benchmarks/results/gate-local-hosts.md). Alone: swap.yml to
tiny_narrow on one host with no peer and no saved baseline, gated against tiny measured there just before.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import MODULE_TIMEOUT, ROOT, main_started_at, remove_instances, unfolded

CATALOG = str(Path(__file__).resolve().parent / "catalog")
# Short rounds: a round of both servers takes a few seconds here.
ROUND = {"concurrency": 8, "num_requests": 16, "output_len": 32, "warmup_requests": 8}
# What tiny_narrow costs against tiny at the gate's concurrency, as measured on these hosts with the gate itself
# (benchmarks/results/gate-local-hosts.md).
MEASURED_CHANGE_PERCENT = -59.5
# The gate of a swap to tiny_narrow, in short rounds.
NARROW_GATE = {
    "vllm_catalog_paths": [CATALOG],
    "vllm_swap_gate_max_rounds": 12,
    **{f"vllm_swap_gate_{name}": value for name, value in ROUND.items() if name != "warmup_requests"},
}


def gate_from_controller(tmp_path, **args) -> dict:
    """llmops.vllm.vllm_gate's result, run on the controller as the rollout runs it."""
    inventory = tmp_path / "controller.json"
    inventory.write_text(json.dumps({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))  # fmt: skip
    command = ["ansible", "localhost", "-i", str(inventory), "-m", "llmops.vllm.vllm_gate", "-a", json.dumps(args)]
    env = {"ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=MODULE_TIMEOUT, cwd=ROOT,
                          env={**os.environ, **env}, check=False)  # fmt: skip
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def side(host, url):
    return {"url": url, "model": "tiny", "api_key": host.api_key}


def test_the_same_server_on_both_hosts_never_regresses(fleet, tmp_path):
    first, second = fleet.hosts
    result = gate_from_controller(
        tmp_path, reference=side(second, second.endpoint), candidate=side(first, f"http://{first.address}:8000"),
        max_rounds=12, fail_on=[], request_timeout=120, **ROUND,
    )  # fmt: skip
    print(f"neutral gate: {result.get('sentence')}; {result.get('rounds')} rounds, {result.get('seconds')} s")
    assert not result.get("failed"), result
    assert result["decision"] in ("pass", "unknown") and result["mode"] == "paired"
    assert 5 <= result["rounds"] <= 12 and result["spread"] > 0
    low, high = result["metrics"][0]["interval_percent"]
    assert low < result["metrics"][0]["change_percent"] < high


@pytest.fixture
def narrow_rollout(fleet):
    settings = {**NARROW_GATE, "vllm_rollout_max_fail_percentage": 0}
    proc = fleet.playbook("playbooks/rollout.yml", "-e", "model=tiny_narrow", "-e", json.dumps(settings))
    yield proc
    for host in fleet.hosts:
        remove_instances(host, "tiny_narrow")


def test_a_regression_made_on_purpose_is_rolled_back_with_the_gate_s_interval(fleet, narrow_rollout):
    first, second = fleet.hosts
    output = unfolded(narrow_rollout)
    print(output[-3000:])
    assert narrow_rollout.returncode == 2, output[-6000:]
    row = re.search(
        rf"{first.name} +\| tiny +\| tiny_narrow +\| [0-9.]+ +\| rolled back +\| [0-9.]+ +\| [0-9.]+ +\|"
        r" regress in (?P<rounds>\d+) rounds: output_throughput (?P<change>[-+][0-9.]+)%"
        r" \[(?P<low>[-+][0-9.]+)%, (?P<high>[-+][0-9.]+)%\]",
        output,
    )
    assert row, output[-6000:]
    assert re.search(rf"{second.name} +\| tiny +\| tiny_narrow +\| [0-9.]+ +\| skipped ", output), output[-6000:]
    low, high = float(row["low"]), float(row["high"])
    assert high < 0 and low <= MEASURED_CHANGE_PERCENT <= high, (row.groupdict(), MEASURED_CHANGE_PERCENT)
    assert 5 <= int(row["rounds"]) <= 12
    # The failure names the gate's decision with its interval, and tiny serves again on the first host.
    assert "Gate the new instance against the reference on" in output and "rolled back, tiny serves again" in output
    assert first.sh("systemctl is-active vllm-tiny.service", check=False).stdout.strip() == "active"


@pytest.fixture
def narrow_swap_beside(fleet):
    first = fleet.hosts[0]
    started_at = main_started_at(first, "vllm-tiny.service")
    settings = {**NARROW_GATE, "vllm_swap_mode": "beside", "vllm_swap_port": 8001, "vllm_swap_replace": "tiny"}
    proc = first.playbook("playbooks/swap.yml", "-e", "model=tiny_narrow", "-e", json.dumps(settings))
    yield proc, started_at
    remove_instances(first, "tiny_narrow")


def test_a_swap_beside_the_old_instance_gates_against_it_and_rolls_back_without_stopping_it(fleet, narrow_swap_beside):
    first = fleet.hosts[0]
    proc, started_at = narrow_swap_beside
    output = unfolded(proc)
    print(output[-3000:])
    assert proc.returncode == 2, output[-6000:]
    assert "Gate the new instance against the old one serving beside it, tiny" in output, output[-6000:]
    found = re.search(
        r"gate: regress in (?P<rounds>\d+) rounds: output_throughput (?P<change>[-+][0-9.]+)%"
        r" \[(?P<low>[-+][0-9.]+)%, (?P<high>[-+][0-9.]+)%\]",
        output,
    )
    assert found, output[-6000:]
    # Paired in the same rounds on one machine: the interval brackets the cost measured beforehand.
    low, high = float(found["low"]), float(found["high"])
    assert high < 0 and low <= MEASURED_CHANGE_PERCENT <= high and 5 <= int(found["rounds"]) <= 12, found.groupdict()
    assert "against a saved baseline" not in output and "rolled back, tiny serves again" in output
    # tiny served throughout: its main process is the one that started before the swap; tiny_narrow is stopped.
    assert first.sh("systemctl is-active vllm-tiny.service", check=False).stdout.strip() == "active"
    assert main_started_at(first, "vllm-tiny.service") == started_at
    assert first.sh("systemctl is-active vllm-tiny_narrow.service", check=False).stdout.strip() != "active"
