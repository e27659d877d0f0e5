"""One model over the two hosts of the fleet: vLLM's own multi-node data parallel serving, deployed by deploy.yml
as one group (the catalog entry tiny_pair: a rank on each host, the first host's API server in front of both, the
second host headless), healed by its members' guards after a killed engine, a killed head and a hung worker,
rolled out by rollout.yml to another group over the same hosts (tiny_pair_next), in one batch, swapped by swap.yml
from there to one that cannot serve in time (tiny_pair_late), which rolls the whole group back, then stopped by
stop.yml."""

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest

from .conftest import remove_instances, unfolded

CATALOG = str(Path(__file__).resolve().parent / "catalog")
ENTRY = "tiny_pair"
# The group's next release, what the swap moves it to; and a group whose load timeout ends before it serves.
NEXT = "tiny_pair_next"
LATE = "tiny_pair_late"
PORT = 8001
# Each member's guard serves its metrics on the instance's port plus 10000.
GUARD_PORT = PORT + 10000
DEPLOY = ("-e", json.dumps({"vllm_instances": [{"model": ENTRY, "port": PORT}], "vllm_catalog_paths": [CATALOG]}))
# The group's settings in the inventory: its guards check every 5 s, wait 5 s for an answer and restart after two
# failed checks in a row; the head may start ten times within its window (its start limit is the group's), for the
# deploy and the faults of these tests. Each check keeps both hosts' engines stepping for a moment (about a second of
# CPU on each host here): at 2 s they kept a core of this machine busy.
GROUP_SETTINGS = {
    "vllm_server_group_guard_interval": 5,
    "vllm_server_group_guard_timeout": 5,
    "vllm_server_group_guard_failures": 2,
    "vllm_server_start_limit_burst": 10,
}
# A fault's bound, from the fault to every rank computing again: on this machine's 2 cores the head and the worker
# each load in about 30 s, beside the first host's tiny.
HEAL_TIMEOUT = 420


def completion(url: str, key: str, rank: int, timeout: float = 120, max_tokens: int = 1, model: str = ENTRY) -> dict:
    """`max_tokens` from the data parallel rank `rank` of `model`, asked through the group's API server."""
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": max_tokens, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"{url}/v1/completions",
        data=body,
        headers={
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "X-data-parallel-rank": str(rank),
        },
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


def every_rank_computes(url: str, key: str, model: str = ENTRY) -> bool:
    try:
        return all(completion(url, key, rank, timeout=5, model=model)["choices"] for rank in (0, 1))
    except (OSError, ValueError):  # refused, reset, timed out, an HTTP error
        return False


def wait_for(condition, what: str, timeout: float = HEAL_TIMEOUT) -> float:
    """Seconds until `condition()` holds, checked every second, at most `timeout`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            pytest.fail(f"{what}: not after {timeout} s")
        time.sleep(1)
    return time.monotonic() - started


def heal(fleet, fault, name: str) -> float:
    """Run `fault()` on the serving group; wait until a rank fails, then until every rank computes again. Returns
    the epoch of the fault; prints the seconds from the fault until the group served again."""
    first, _second = fleet.hosts
    url = f"http://{first.address}:{PORT}"
    assert every_rank_computes(url, first.api_key)
    at, started = time.time(), time.monotonic()
    fault()
    wait_for(lambda: not every_rank_computes(url, first.api_key), "the fault stopping a rank", timeout=60)
    wait_for(lambda: every_rank_computes(url, first.api_key), "the group serving again")
    seconds = time.monotonic() - started
    print(f"{name}: every rank computes again {seconds:.1f} s after the fault")
    return at


def guard_unit(instance: str = ENTRY) -> str:
    return f"llmops-vllm-guard-{instance}.service"


def guard_log(host, since: float) -> str:
    return host.sh(f"journalctl -u {guard_unit()} --since @{int(since)} -o cat --no-pager").stdout


def longer_than_one_token_by_engine(head) -> dict[str, float]:
    """vLLM's count, for each data parallel engine, of the requests that asked for more than one token, from the API
    server's /metrics, which answers the host itself. The head's guard asks each rank for one token every few
    seconds: its checks are left out."""
    result = head.module("ansible.builtin.uri", url=f"http://127.0.0.1:{PORT}/metrics", return_content=True)
    assert not result.get("failed"), result
    text = result["content"]
    counts = {}
    requests = r'^vllm:request_params_max_tokens_count\{[^}]*engine="(\d+)"[^}]*\} (\S+)$'
    for engine, value in re.findall(requests, text, re.M):
        counts[engine] = counts.get(engine, 0.0) + float(value)
    one_token = r'^vllm:request_params_max_tokens_bucket\{[^}]*engine="(\d+)"[^}]*le="1\.0"[^}]*\} (\S+)$'
    for engine, value in re.findall(one_token, text, re.M):
        counts[engine] -= float(value)
    return counts


def record(host, instance=ENTRY) -> dict:
    result = host.module("llmops.vllm.vllm_instance_info", config_dir=host.config_dir, instances=[instance])
    assert not result.get("failed"), result
    return result["instances"][0]


@pytest.fixture(scope="module")
def pair(fleet, tmp_path_factory):
    """The group deployed over both hosts by one deploy.yml; removed from both afterwards."""
    first, second = fleet.hosts
    group = {ENTRY: {"hosts": {first.name: {}, second.name: {}}, "vars": GROUP_SETTINGS}}
    inventory = fleet.inventory_with(tmp_path_factory.mktemp("group") / "hosts.yml", groups=group)
    deployed = fleet.playbook("playbooks/deploy.yml", *DEPLOY, inventory=inventory)
    yield inventory, deployed
    for host in fleet.hosts:
        remove_instances(host, ENTRY, NEXT, LATE)


def test_one_deploy_makes_the_group_and_each_rank_computes(fleet, pair):
    first, second = fleet.hosts
    _inventory, deployed = pair
    output = unfolded(deployed)
    assert deployed.returncode == 0, output[output.find("fatal:") - 3000 :][:6000]
    head, worker = record(first), record(second)
    assert head["group"]["role"] == "head" and worker["group"]["role"] == "worker"
    assert worker["group"]["serves_api"] is False and worker["url"] == f"http://{first.address}:{PORT}"
    url = f"http://{first.address}:{PORT}"
    before = longer_than_one_token_by_engine(first)
    for rank in (0, 1):
        reply = completion(url, first.api_key, rank, max_tokens=2)
        assert reply["choices"][0]["finish_reason"] in ("length", "stop")
    after = longer_than_one_token_by_engine(first)
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


def test_each_member_runs_with_its_guard_whose_metrics_answer_its_host_alone(fleet, pair):
    for host in fleet.hosts:
        assert host.sh(f"systemctl is-active {guard_unit()}", check=False).stdout.strip() == "active", host.name
    first, second = fleet.hosts
    wait_for(lambda: "guarding the head" in guard_log(first, 0), "the head's guard starting", timeout=60)
    wait_for(lambda: "guarding the worker" in guard_log(second, 0), "the worker's guard starting", timeout=60)
    # Once the group has served, the head's guard exports each rank's last check; every cause starts at zero.
    wait_for(lambda: 'rank="1",rank_host="' + second.name + '"} 1' in guard_metrics(first)[1], "rank 1's check")
    _status, head = guard_metrics(first)
    assert 'llmops_vllm_group_member_active{role="head"} 1' in head, head
    assert f'llmops_vllm_group_restarts_total{{role="head",failed_host="{second.name}"}}' in head, head
    _status, worker = guard_metrics(second)
    assert f'llmops_vllm_group_restarts_total{{role="worker",failed_host="{first.name}"}}' in worker, worker
    # Another host that is no metrics reader is refused, as the servers' /metrics refuse it.
    assert guard_metrics(first, reader=second)[0] == 403


MAIN_PID = f"$(systemctl show -p MainPID --value vllm-{ENTRY}.service)"
# Each fault: the host it hits (0 the head, 1 the worker), the command, the host whose guard must have acted, and
# what that guard's journal says.
FAULTS = {
    # The worker restarts alone and waits for a handshake that the head, unaware, never sends: the head's guard finds
    # rank 1 silent and restarts the head, which the waiting worker joins.
    "worker_engine_killed": (1, f"kill -KILL $(pgrep -P {MAIN_PID} -f VLLM::EngineCore)", 0, "rank 1 on {worker}"),
    # systemd restarts the head; the worker, still joined to the dead head, is restarted by its guard.
    "head_killed": (0, f"kill -KILL {MAIN_PID}", 1, "the head stopped answering"),
    # Requests to rank 1 wait: the head's guard restarts the head, the worker's guard the worker, and systemd kills
    # the stopped processes.
    "worker_hung": (1, f"systemctl kill --kill-whom=all --signal=SIGSTOP vllm-{ENTRY}.service", 0,
                    "rank 1 on {worker}: no answer"),
}  # fmt: skip


def guard_metrics(host, reader=None) -> tuple[int, str]:
    """(status, body) of GET /metrics of the host's guard of the group, asked from `reader` (the host itself)."""
    result = (reader or host).module("ansible.builtin.uri", url=f"http://{host.address}:{GUARD_PORT}/metrics",
                                     return_content=True, status_code=[200, 403])  # fmt: skip
    assert not result.get("failed"), result
    return result["status"], result["content"]


def guard_restarts(host) -> dict[str, float]:
    """The guard's restarts of its member, by the host whose failure caused them."""
    status, text = guard_metrics(host)
    assert status == 200, text
    return {failed: float(count) for failed, count in re.findall(r'failed_host="([^"]+)"\} (\S+)', text)}


@pytest.mark.parametrize("fault", FAULTS)
def test_the_group_serves_again_after(fleet, pair, fault):
    hit, command, acting, says = FAULTS[fault]
    hosts = fleet.hosts
    # The member whose failure the acting guard counts: the worker's for the head's guard, the head's for a worker's.
    failed = hosts[1 - acting].name
    before = guard_restarts(hosts[acting])

    def run_the_fault():
        hosts[hit].sh(command)

    at = heal(fleet, run_the_fault, fault)
    log = guard_log(hosts[acting], at)
    assert says.format(worker=hosts[1].name) in log, log
    # Its metrics name the failed member, for the alert VllmGroupMemberRestarted.
    after = guard_restarts(hosts[acting])
    assert after[failed] >= before[failed] + 1, after
    assert {cause: count for cause, count in after.items() if cause != failed} == {
        cause: count for cause, count in before.items() if cause != failed
    }
    assert hosts[1].sh("ps -eo stat= | grep -c '^T'", check=False).stdout.strip() == "0", "a stopped process is left"


def swap(fleet, inventory, model: str, replace: str):
    settings = {"model": model, "vllm_swap_replace": replace, "vllm_catalog_paths": [CATALOG]}
    return fleet.playbook("playbooks/swap.yml", "-e", json.dumps(settings), inventory=inventory)


def states(host, instance: str) -> tuple[str, str]:
    """(ActiveState, UnitFileState) of the instance's unit and of its guard's, on the host."""
    unit = f"vllm-{instance}.service"
    shown = host.sh(f"systemctl show -P ActiveState {unit} {guard_unit(instance)}; systemctl is-enabled {unit}",
                    check=False).stdout.split()  # fmt: skip
    return shown[0], shown[1], shown[2]


def test_a_rollout_moves_the_whole_group_to_the_next_entry_in_one_batch(fleet, pair):
    """rollout.yml in its batches of one host: the batch grows to hold both hosts of the group, which swap at once."""
    inventory, _deployed = pair
    first, _second = fleet.hosts
    settings = {"model": NEXT, "vllm_swap_replace": ENTRY, "vllm_catalog_paths": [CATALOG]}
    rolled_out = fleet.playbook("playbooks/rollout.yml", "-e", json.dumps(settings), inventory=inventory)
    output = unfolded(rolled_out)
    assert rolled_out.returncode == 0, output[output.find("fatal:") - 3000 :][:6000]
    rows = re.findall(rf"(\S+) +\| {ENTRY} +\| {NEXT} +\| [0-9.]+ +\| swapped ", output)
    # Batches of one would have split the group, which a batch refuses on the group's hosts.
    assert sorted(rows) == sorted(host.name for host in fleet.hosts), output[-6000:]
    for host in fleet.hosts:
        # The new member and its guard run and start at boot; the old member and its guard are stopped, disabled.
        assert states(host, NEXT) == ("active", "active", "enabled"), host.name
        old_unit, old_guard, old_enabled = states(host, ENTRY)
        assert old_unit in ("inactive", "failed") and old_guard in ("inactive", "failed"), host.name
        assert old_enabled == "disabled", host.name
    url = f"http://{first.address}:{PORT}"
    for rank in (0, 1):
        reply = completion(url, first.api_key, rank, max_tokens=2, model=NEXT)
        assert reply["model"] == NEXT and reply["choices"][0]["text"]


def test_a_group_swap_that_fails_rolls_every_host_back(fleet, pair):
    inventory, _deployed = pair
    first, _second = fleet.hosts
    failed = swap(fleet, inventory, LATE, replace=NEXT)
    output = unfolded(failed)
    assert failed.returncode != 0, output[-6000:]
    rolled_back = re.findall(rf"rolled back in [0-9.]+ s \({NEXT} -> {LATE}\); down [0-9.]+ s", output)
    assert len(rolled_back) == 2, output[-6000:]
    print("\n".join(rolled_back))
    assert f"rolled back, {NEXT} serves again" in output, output[-6000:]
    for host in fleet.hosts:
        assert states(host, NEXT) == ("active", "active", "enabled"), host.name
        late_unit, late_guard, late_enabled = states(host, LATE)
        assert late_unit in ("inactive", "failed") and late_guard in ("inactive", "failed"), host.name
        assert late_enabled == "disabled", host.name
    assert every_rank_computes(f"http://{first.address}:{PORT}", first.api_key, model=NEXT)


def test_stop_ends_the_group_on_both_hosts_and_no_guard_starts_it_again(fleet, pair):
    inventory, _deployed = pair
    stopped = fleet.playbook("playbooks/stop.yml", "-e", f"instance={NEXT}", inventory=inventory)
    assert stopped.returncode == 0, unfolded(stopped)[-6000:]
    for host in fleet.hosts:
        # The guard stopped with its member: nothing is left to start the member again.
        unit, guard, _enabled = states(host, NEXT)
        assert unit in ("inactive", "failed") and guard in ("inactive", "failed"), (host.name, unit, guard)
