"""Observability against the real vLLM serving `tiny` and a real Prometheus (Debian's package) on the local host.

playbooks/monitoring.yml makes the host its own monitoring host: the vllm_prometheus role installs and runs
Prometheus with the collection's alert rules, their durations cut to seconds, and the vllm_targets role publishes
tiny as its target. Then: the target and its labels, /metrics refused to another address, every metric of the
dashboard and the rules on the real /metrics, an engine core killed (VllmInstanceDown fires and clears, then
VllmInstanceRestarted), status.yml's tokens per second, an engine core stopped (SIGSTOP) with requests in flight
(VllmEngineHung fires while /health answers 200, and clears on SIGCONT; VllmInstanceRestarted clears meanwhile),
and swap.yml to tiny2, after which the targets name tiny2 alone. Each test prints how long its alerts took to fire
and to clear.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from ansible_collections.llmops.vllm.plugins.module_utils.observability.alert_rules import alert_rules
from ansible_collections.llmops.vllm.plugins.module_utils.observability.grafana_dashboard import dashboard

from .conftest import remove_instances

ROOT = Path(__file__).resolve().parents[2]
STREAM_CLIENTS = Path(__file__).with_name("stream_clients.py")
TARGETS_DIR = "/etc/prometheus/vllm-targets"
# Prometheus reads tiny every 2 s (a scrape of a busy server on 1.5 CPUs can take a second) and evaluates the rules
# every second. The alerts hold for seconds instead of minutes; a restart is seen within 90 s, which must cover
# systemd's RestartSec (10 s) and tiny's load.
ALERTS = {
    "instance_down": {"for": "4s"},
    "instance_restarted": {"window": "90s"},
    "engine_hung": {"window": "8s", "for": "4s"},
}
SETTINGS = {
    "vllm_prometheus_scrape_interval": "2s",
    "vllm_prometheus_scrape_timeout": "2s",
    "vllm_prometheus_evaluation_interval": "1s",
    "vllm_prometheus_alerts": ALERTS,
}
# The most any alert here may take to fire or clear: its window and hold, with room for a loaded 2-core machine.
ALERT_BOUND = 60
# Streams that keep tiny busy when its engine core is stopped.
STREAMS = 3
STREAM_TOKENS = 1500

# Run on the host with its own Python: steps in order, each timed from the first. `signal:SIG:PID` sends a signal;
# `until:LABEL:EXPR` waits (at most TIMEOUT s) until Prometheus's instant query EXPR returns a series; `health:LABEL`
# records the status of tiny's /health. Prints {label: seconds since the first step} and the statuses.
CLOCK = r"""
import json, os, signal, sys, time, urllib.error, urllib.parse, urllib.request
timeout = float(sys.argv[1])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def query(expr):
    url = "http://localhost:9090/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    return json.load(opener.open(url, timeout=5))["data"]["result"]
start, times, health = None, {}, {}
for step in sys.argv[2:]:
    kind, rest = step.split(":", 1)
    if kind == "signal":
        name, pid = rest.split(":")
        os.kill(int(pid), getattr(signal, "SIG" + name))
    elif kind == "until":
        label, expr = rest.split(":", 1)
        deadline = time.monotonic() + timeout
        while not query(expr):
            if time.monotonic() > deadline:
                print(json.dumps({"times": times, "timed_out": label, "expr": expr}))
                sys.exit(1)
            time.sleep(0.2)
    elif kind == "health":
        label = rest
        try:
            health[label] = opener.open("http://127.0.0.1:8000/health", timeout=10).status
        except (urllib.error.URLError, OSError) as error:
            health[label] = getattr(error, "code", repr(error))
    start = start if start is not None else time.monotonic()
    if kind != "signal":
        times[label] = round(time.monotonic() - start, 1)
print(json.dumps({"times": times, "health": health}))
"""

# An HTTP GET from the host, from `source` (one of its addresses): (status, body).
GET_FROM = r"""
import http.client, json, sys
url_host, port, path, source = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
connection = http.client.HTTPConnection(url_host, port, timeout=30, source_address=(source, 0) if source else None)
connection.request("GET", path)
response = connection.getresponse()
print(json.dumps([response.status, response.read().decode()]))
"""

QUERY = r"""
import json, sys, urllib.parse, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
results = {}
for expr in json.loads(sys.stdin.read()):
    url = "http://localhost:9090/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    results[expr] = json.load(opener.open(url, timeout=10))["data"]["result"]
print(json.dumps(results))
"""


def alert(name: str, state: str = "firing") -> str:
    """A query that returns a series while the alert is in `state` (firing), or once it is not (cleared)."""
    firing = f'ALERTS{{alertname="{name}", alertstate="firing", vllm_instance="tiny"}}'
    return firing if state == "firing" else f"absent({firing})"


def clock(host, *steps: str, timeout: float = ALERT_BOUND) -> dict:
    proc = host.sh(
        f"python3 -c {shlex.quote(CLOCK)} {timeout} {' '.join(shlex.quote(step) for step in steps)}",
        check=False,
        timeout=timeout * len(steps) + 60,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout)


def get_from(host, path: str, source: str = "", url_host: str = "127.0.0.1") -> tuple[int, str]:
    proc = host.sh(f"python3 -c {shlex.quote(GET_FROM)} {url_host} 8000 {path} {shlex.quote(source)}")
    return tuple(json.loads(proc.stdout))


def prometheus_query(host, exprs: list[str]) -> dict:
    proc = host.sh(f"python3 -c {shlex.quote(QUERY)} <<'EOF'\n{json.dumps(exprs)}\nEOF")
    return json.loads(proc.stdout)


def status_table(host, *args: str) -> dict:
    """status.yml's table, {instance: {column: cell}}, from the play's JSON output."""
    env = {**os.environ, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    command = ["ansible-playbook", "-i", str(host.inventory), "--limit", host.name, "playbooks/status.yml", *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    tasks = json.loads(proc.stdout)["plays"][0]["tasks"]
    [lines] = [task["hosts"][host.name]["msg"] for task in tasks if task["task"]["name"].endswith("Show the fleet")]
    header, _rule, *rows = ([cell.strip() for cell in line.strip("|").split("|")] for line in lines if line[0] == "|")
    return {row[1]: dict(zip(header, row, strict=True)) for row in rows}


def engine_core_pid(host) -> str:
    main_pid = host.sh("systemctl show -p MainPID --value vllm-tiny.service").stdout.strip()
    engine = host.sh(f"pgrep --parent {main_pid} --full '^VLLM::EngineCore'").stdout.split()
    assert len(engine) == 1, engine
    return engine[0]


@pytest.fixture(scope="module")
def monitored(deployed, tmp_path_factory):
    """The host as its own monitoring host, Prometheus running and scraping tiny; Prometheus stopped after."""
    inventory = json.loads(deployed.inventory.read_text())
    inventory["vllm_monitoring"] = {"hosts": {deployed.name: {}}}
    directory = tmp_path_factory.mktemp("monitoring")
    (directory / "hosts.yml").write_text(json.dumps(inventory))
    host = dataclasses.replace(deployed, inventory=directory / "hosts.yml")
    # A catalog of the user's whose tiny sets an SLO, far above what tiny takes: its rule is written, never fires.
    catalog = directory / "catalog"
    catalog.mkdir()
    entry = yaml.safe_load((ROOT / "models" / "tiny.yml").read_text())
    (catalog / "tiny.yml").write_text(yaml.safe_dump({**entry, "slo": {"p99_ttft_ms": 60000}}))
    settings = {**SETTINGS, "vllm_catalog_paths": [str(catalog)]}
    started = time.monotonic()
    proc = host.playbook("playbooks/monitoring.yml", "-e", json.dumps(settings))
    assert proc.returncode == 0, f"monitoring.yml failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    print(f"monitoring.yml (Prometheus installed and started, tiny published) took {time.monotonic() - started:.0f} s")
    yield host
    host.sh("systemctl disable --now prometheus")


def test_prometheus_scrapes_tiny_at_the_target_its_record_gives(monitored):
    host = monitored
    [group] = json.loads(host.sh(f"cat {TARGETS_DIR}/vllm/{host.name}.json").stdout)
    record = json.loads(host.sh("cat /etc/vllm/tiny.json").stdout)
    assert group == {
        "targets": ["127.0.0.1:8000"],
        "labels": {
            "host": host.name,
            "vllm_instance": "tiny",
            "model": "tiny",
            "served_name": "tiny",
            "gpus": "all",
            "vllm_version": record["vllm_version"],
        },
    }
    times = clock(host, "until:scraped:" + 'up{job="vllm", vllm_instance="tiny"} == 1')
    print(f"Prometheus scraped tiny {times['times']['scraped']} s after the play")
    rules = host.sh("cat /etc/prometheus/llmops-vllm-rules.yml").stdout
    assert "alert: VllmLatencyAboveSlo" in rules and 'model="tiny"' in rules and "> 60" in rules
    assert "[8s]" in rules and "for: 4s" in rules


def test_metrics_answer_the_host_and_its_readers_alone(monitored):
    host = monitored
    # An address of the host that is not loopback: a client there is another host to the server.
    address = host.sh("hostname -I | awk '{print $1}'").stdout.strip()
    assert address and not address.startswith("127."), f"the host has no address but loopback: {address!r}"
    assert get_from(host, "/metrics")[0] == 200
    status, body = get_from(host, "/metrics", source=address)
    assert status == 403 and "/etc/vllm/metrics-readers" in body
    assert get_from(host, "/health", source=address)[0] == 200
    # The server on the host's own address, reached from there: the host itself.
    assert get_from(host, "/metrics", source=address, url_host=address)[0] == 200
    # A reader listed in the file reads them, without a restart of the server; then the host's file as it was.
    readers = host.sh("cat /etc/vllm/metrics-readers").stdout
    host.sh(f"printf '%s\\n' {address} >> /etc/vllm/metrics-readers")
    try:
        assert get_from(host, "/metrics", source=address)[0] == 200
    finally:
        host.sh(f"cat > /etc/vllm/metrics-readers <<'EOF'\n{readers}EOF")
    assert get_from(host, "/metrics", source=address)[0] == 403


def metric_names(exprs: list[str]) -> set[str]:
    return {name for expr in exprs for name in re.findall(r"\b(vllm:[a-z_:]+|process_start_time_seconds)\b", expr)}


def test_every_metric_of_the_dashboard_and_the_rules_is_on_the_real_metrics(monitored):
    host = monitored
    exposed = {
        line.split("{")[0].split(" ")[0]
        for line in get_from(host, "/metrics")[1].splitlines()
        if line and not line.startswith("#")
    }
    model = dashboard()
    panel_exprs = [target["expr"] for panel in model["panels"] for target in panel.get("targets", [])]
    rule_exprs = [
        rule["expr"] for group in alert_rules(slos={"tiny": {"p99_ttft_ms": 1, "p99_itl_ms": 1, "p99_e2el_ms": 1}})
        ["groups"] for rule in group["rules"]
    ]  # fmt: skip
    read = metric_names(panel_exprs + rule_exprs)
    assert {"vllm:kv_cache_usage_perc", "vllm:engine_sleep_state", "vllm:time_to_first_token_seconds_bucket",
            "vllm:inter_token_latency_seconds_bucket", "process_start_time_seconds"} <= read  # fmt: skip
    assert sorted(read - exposed) == []
    # And each panel's query, as Grafana sends it, returns tiny's series from the real Prometheus.
    variables = {"$__rate_interval": "1m", "$__range": "1h", "$host": ".*", "$instance": "tiny"}
    queries = []
    for expr in panel_exprs:
        for variable, value in variables.items():
            expr = expr.replace(variable, value)
        queries.append(expr)
    answered = prometheus_query(host, queries)
    empty = [expr for expr, series in answered.items() if not series]
    # A request tiny finished (the deploy's check streams one): finished requests, the latencies, all have series.
    assert empty == []


def test_a_killed_engine_core_fires_instance_down_and_restarted(monitored):
    """Down fires while systemd restarts the unit and clears once Prometheus reads tiny again; Restarted fires then,
    for its window: the next test, which waits for the hung engine meanwhile, sees it clear."""
    host = monitored
    killed = clock(
        host,
        f"signal:KILL:{engine_core_pid(host)}",
        "until:down_fired:" + alert("VllmInstanceDown"),
        "until:up_again:" + 'up{vllm_instance="tiny"} == 1',
        "until:down_cleared:" + alert("VllmInstanceDown", "cleared"),
        "until:restarted_fired:" + alert("VllmInstanceRestarted"),
        timeout=300,
    )
    times = killed["times"]
    print(
        f"SIGKILL of the engine core: VllmInstanceDown fired after {times['down_fired']} s; Prometheus read tiny "
        f"again after {times['up_again']} s and the alert cleared {times['down_cleared'] - times['up_again']:.1f} s "
        f"later; VllmInstanceRestarted fired {times['restarted_fired'] - times['up_again']:.1f} s after that read"
    )
    assert times["down_fired"] >= 4  # held for 4 s
    # The unit serves again: the next tests find tiny as they expect it.
    assert get_from(host, "/health")[0] == 200


def test_status_shows_tokens_per_second_and_a_stopped_engine_core_fires_engine_hung(monitored):
    host = monitored
    host.copy_in(str(STREAM_CLIENTS), "/tmp/llmops_g_stream_clients.py")
    output = "/tmp/llmops-g-streams.json"
    host.sh(
        f"rm -f {output} {output}.streaming; systemd-run --quiet --unit=llmops-g-streams --collect python3 "
        f"/tmp/llmops_g_stream_clients.py {host.endpoint} tiny {host.api_key} {STREAMS} {STREAM_TOKENS} {output}"
    )
    engine = None
    try:
        host.sh(f"for _ in $(seq 600); do test -e {output}.streaming && exit; sleep 0.1; done; exit 1", timeout=90)
        table = status_table(host, "-e", "vllm_status_throughput_seconds=3")
        generated = table["tiny"]["gen tok/s"]
        print(f"status.yml: tiny generated {generated} tok/s under {STREAMS} streams")
        assert float(generated) > 0
        engine = engine_core_pid(host)
        stopped = clock(
            host,
            "until:busy:" + 'sum(vllm:num_requests_running{vllm_instance="tiny"}) > 0',
            f"signal:STOP:{engine}",
            "until:fired:" + alert("VllmEngineHung"),
            "health:while_hung",
            f"signal:CONT:{engine}",
            "until:cleared:" + alert("VllmEngineHung", "cleared"),
        )
    finally:
        host.sh(f"{f'kill -CONT {engine}; ' if engine else ''}systemctl stop llmops-g-streams 2>/dev/null || true")
    times = stopped["times"]
    fired, cleared = times["fired"] - times["busy"], times["cleared"] - times["fired"]
    print(f"VllmEngineHung fired {fired:.1f} s after SIGSTOP and cleared {cleared:.1f} s after SIGCONT")
    assert stopped["health"]["while_hung"] == 200  # vLLM issue 39863: /health says nothing of a hung engine
    assert fired >= 8 + 4 - 2  # the 8 s window without a token, then 4 s held, give or take a scrape
    # Prometheus read the server all along: it hung, it did not go down or restart.
    span = f"{int(times['cleared'] - times['busy']) + 2}s"
    seen = prometheus_query(host, [f'min_over_time(up{{vllm_instance="tiny"}}[{span}])'])
    assert [series["value"][1] for series in seen.popitem()[1]] == ["1"]
    # VllmInstanceRestarted, fired by the previous test's kill, clears once its window has passed.
    clock(host, "until:cleared:" + alert("VllmInstanceRestarted", "cleared"), timeout=120)
    [uptime] = prometheus_query(host, ['time() - process_start_time_seconds{vllm_instance="tiny"}']).popitem()[1]
    print(f"VllmInstanceRestarted cleared {float(uptime['value'][1]):.0f} s after the server started again")


def test_the_targets_follow_a_swap(monitored):
    """swap.yml from tiny to tiny2: the targets name the instance that serves, Prometheus reads it, and the one
    stopped is no target, so no alert follows it after the play. Then tiny serves again, as the next tests expect."""
    host = monitored
    try:
        proc = host.playbook("playbooks/swap.yml", "-e", "model=tiny2")
        assert proc.returncode == 0, f"swap.yml failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
        [group] = json.loads(host.sh(f"cat {TARGETS_DIR}/vllm/{host.name}.json").stdout)
        assert group["targets"] == ["127.0.0.1:8000"]
        assert (group["labels"]["vllm_instance"], group["labels"]["model"]) == ("tiny2", "tiny2")
        times = clock(
            host,
            "until:tiny2_read:" + 'up{vllm_instance="tiny2"} == 1',
            "until:tiny_gone:" + 'absent(up{vllm_instance="tiny"})',
            "until:no_alert:" + 'absent(ALERTS{alertname="VllmInstanceDown", vllm_instance="tiny"})',
        )
        print(f"after swap.yml tiny -> tiny2, seconds until Prometheus: {times['times']}")
    finally:
        remove_instances(host, "tiny2")
        host.sh("systemctl enable vllm-tiny.service")
        started = host.module("llmops.vllm.vllm_service", instance="tiny", state="started")
        assert not started.get("failed"), started
