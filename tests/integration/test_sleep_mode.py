"""Sleep mode on the CPU host under real systemd: what is refused before any change, and the guard of vLLM's
development endpoints in front of a real vLLM. The sleep and the wake-up themselves need a CUDA build: they are
measured on the GPU machine (benchmarks/gpu/harness.py sleep-swap, docs/fleet.md)."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest

from .conftest import copy_stream_clients, engine_gauge, remove_instances

CATALOG = str(Path(__file__).resolve().parent / "catalog")
CATALOG_ARG = json.dumps({"vllm_catalog_paths": [CATALOG]})


def tiny_main_pid(host) -> str:
    return host.sh("systemctl show -p MainPID --value vllm-tiny.service").stdout.strip()


def assert_nothing_of(host, instance: str):
    """No record, unit, environment or weights of the instance on the host."""
    leftovers = host.sh(
        f"ls -d /etc/vllm/{instance}.json /etc/vllm/{instance}.env /etc/systemd/system/vllm-{instance}.service "
        f"/var/lib/vllm/models/{instance} 2>/dev/null || true"
    ).stdout.split()
    assert leftovers == []


def test_a_swap_in_sleep_mode_is_refused_on_the_cpu_build_before_any_change(deployed):
    pid = tiny_main_pid(deployed)
    proc = deployed.playbook(
        "playbooks/swap.yml",
        "-e", "model=tiny_next", "-e", CATALOG_ARG, "-e", "vllm_swap_mode=sleep", "-e", "vllm_swap_sleep_memory_mib=1",
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-4000:]
    assert "Sleep mode refused: vLLM's CPU build has no sleep mode" in output
    assert "tiny was not started with sleep mode" in output
    assert "tiny keeps its port 8000 while it sleeps: the new instance needs a port of its own" in output
    assert "of CPU memory asleep, more than the budget of 1 MiB" in output
    assert "Nothing changed" in output
    # The old instance served throughout, the same process; nothing of the new one was written.
    assert tiny_main_pid(deployed) == pid
    assert status_of(deployed, "GET", "http://127.0.0.1:8000/health") == "200"
    assert_nothing_of(deployed, "tiny_next")


def test_a_deploy_with_sleep_mode_is_refused_on_the_cpu_build(deployed):
    proc = deployed.playbook(
        "playbooks/deploy.yml", "-e", CATALOG_ARG, "-e", '{"vllm_instances": [{"model": "tiny_sleepy", "port": 8003}]}'
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "asks for sleep mode, which vLLM's CPU build does not have" in output
    assert_nothing_of(deployed, "tiny_sleepy")


@pytest.fixture(scope="module")
def dev_instance(deployed):
    """tiny_dev on port 8002, with vLLM's development endpoints behind the guard; removed afterwards."""
    proc = deployed.playbook(
        "playbooks/deploy.yml", "-e", CATALOG_ARG, "-e", '{"vllm_instances": [{"model": "tiny_dev", "port": 8002}]}'
    )
    assert proc.returncode == 0, f"deploy.yml failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    yield deployed
    remove_instances(deployed, "tiny_dev")


# An HTTP status from the host itself, with its own Python: the client's address is the one it connects from.
STATUS_SCRIPT = """
import sys, urllib.error, urllib.request
url, method, key = sys.argv[1:4]
request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
if key:
    request.add_header("Authorization", "Bearer " + key)
try:
    print(urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=60).status)
except urllib.error.HTTPError as error:
    print(error.code)
"""


def status_of(host, method: str, url: str, key: str = "") -> str:
    return host.sh(f"python3 -c {shlex.quote(STATUS_SCRIPT)} {url} {method} {shlex.quote(key)}").stdout.strip()


def test_other_hosts_reach_the_api_of_a_development_server_and_nothing_else(dev_instance):
    host = dev_instance
    environment = host.sh("cat /etc/vllm/tiny_dev.env").stdout
    assert 'VLLM_SERVER_DEV_MODE="1"' in environment or "VLLM_SERVER_DEV_MODE=1" in environment
    unit = host.sh("systemctl cat vllm-tiny_dev.service").stdout
    assert "--middleware llmops_vllm_dev_guard.LoopbackOnlyDevEndpoints" in unit
    # An address of the host that is not loopback: a client there is another host to the server.
    address = host.sh("hostname -I | awk '{print $1}'").stdout.strip()
    assert address and not address.startswith("127."), f"the host has no address but loopback: {address!r}"
    remote, local = f"http://{address}:8002", "http://127.0.0.1:8002"
    for method, path in (("POST", "/reset_prefix_cache"), ("POST", "/collective_rpc"), ("GET", "/server_info")):
        assert status_of(host, method, remote + path) == "403", path
    assert status_of(host, "POST", local + "/reset_prefix_cache") == "200"
    assert status_of(host, "GET", local + "/server_info") == "200"
    # The API: guarded by the key as before, from anywhere.
    assert status_of(host, "GET", remote + "/v1/models", host.api_key) == "200"
    assert status_of(host, "GET", remote + "/v1/models") == "401"
    assert status_of(host, "GET", remote + "/health") == "200"


# Requests that wait behind the one that tiny_dev (one request at a time) runs.
QUEUED = 3


def test_requests_that_vllm_aborts_before_their_first_token_are_answered_503(dev_instance):
    """tiny_dev runs one request at a time; the others wait in its engine. A pause that aborts ends them all, the
    waiting ones before their first token: vLLM answers those 200 and an empty stream, the collection's middleware
    503 with Retry-After. The one running streams its tokens and ends cut off, as vLLM ends it."""
    host, local = dev_instance, "http://127.0.0.1:8002"
    copy_stream_clients(host)
    # Each client stream stops at its first request that does not stream every token: one request each here.
    clients = f"/tmp/stream_clients.py {local} tiny_dev {shlex.quote(host.api_key)} {QUEUED + 1} 2000 /tmp/queued.json"
    host.sh("rm -f /tmp/queued.json")
    host.spawn(f"python3 {clients}")
    try:
        deadline = time.monotonic() + 60
        while engine_gauge(host, local, "vllm:num_requests_waiting") < QUEUED:
            assert time.monotonic() < deadline, f"{QUEUED} requests did not wait in the engine within 60 s"
            time.sleep(0.2)
        assert status_of(host, "POST", local + "/pause?mode=abort") == "200"
        host.sh("for _ in $(seq 300); do test -e /tmp/queued.json && exit; sleep 0.1; done; exit 1")
    finally:
        assert status_of(host, "POST", local + "/resume") == "200"
    records = json.loads(host.sh("cat /tmp/queued.json").stdout)
    print(f"requests aborted by a pause: {[(record['status'], record['retry_after']) for record in records]}")
    refused = [record for record in records if record["status"] == 503]
    # The one running when the pause came streamed tokens; on a fast host the next may have begun as well.
    assert QUEUED - 1 <= len(refused) <= QUEUED, records
    for record in refused:
        assert (record["retry_after"], record["error_code"], record["chunks"]) == ("1", 503, 0), record
    streamed = [record for record in records if record not in refused]
    assert all(record["status"] == 200 and record["chunks"] >= 1 for record in streamed), records
    assert status_of(host, "GET", local + "/health") == "200"
