"""vLLM's router in front of the two hosts of the fleet, under real systemd with real vLLM, measured by the client.

router.yml runs the router on the first host, in front of the instance of `tiny` on each host, each reached at its
host's network address. The test's own client (tests/integration/router_load.py) streams completions through the
router from this machine, another address, and counts what it gets; the router's own metrics must agree. In order:
the key check from other hosts, a second run that changes nothing, status.yml, a rollout of both hosts to tiny_v2
(same served name) under load, whose first starts read vLLM's answer about the model's class that tiny's left, a
killed engine core under load, stop.yml of the second host under load, the
refusals before any change (a router that does not answer, an instance without a record), and a swap of the one
host left behind the router, whose gap the client measures. The figures go to benchmarks/results/router-local-hosts.md.
"""

from __future__ import annotations

import json
import re
import shlex
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import Fleet, LocalHost, deploy_tiny, engine_gauge, main_started_at, remove_instances, unfolded
from .router_load import StreamingLoad

CATALOG = json.dumps({"vllm_catalog_paths": [str(Path(__file__).resolve().parent / "catalog")]})
ROUTER_PORT = 8080
METRICS_PORT = 29000
ROUTER_VARS = {
    "vllm_router_policy": "round_robin",
    "vllm_router_port": ROUTER_PORT,
    # The test reads the router's metrics from this machine.
    "vllm_router_prometheus_host": "0.0.0.0",
    "vllm_router_prometheus_port": METRICS_PORT,
    "vllm_router_health_check_interval": 2,
    "vllm_router_health_failure_threshold": 2,
    "vllm_router_health_check_timeout": 2,
}
# The longest the router may send requests to a dead worker: failures in a row times the interval, and a timeout.
HEALTH_BOUND = 2 * 2 + 2
UNIT = "vllm-router.service"
# Seconds each client thread waits between two requests (a request takes about 0.15 s here): the load goes on, a
# request or so a second to each host, and the engine that serves it leaves the machine's cores to the host that
# starts a new one and to the other tests running beside these.
LOAD_PAUSE = 1.0
# Seconds the router's counts may take to hold a request that the client has seen answered.
METRICS_CATCH_UP = 10
# Streams in flight on an instance that is stopped, long enough that it drains for several seconds (tiny_v2 runs
# 32 at once; its drain ends at 10 s), and the completions the router's client gets meanwhile.
DRAIN_STREAMS = 32
DRAIN_TOKENS = 2000
ROUTED_DURING_DRAIN = 6
# What vLLM logs as it begins to drain its requests at a stop (0.32).
VLLM_DRAINING = "[shutdown] API server: stopping engine client mode=drain"


@dataclass
class Routed:
    fleet: Fleet
    inventory: Path
    url: str
    metrics_url: str

    @property
    def router_host(self) -> LocalHost:
        return self.fleet.hosts[0]

    def playbook(self, playbook: str, *args: str):
        return self.fleet.playbook(playbook, *args, inventory=self.inventory)

    def info(self) -> dict:
        result = self.router_host.module("llmops.vllm.vllm_router_info")
        assert not result.get("failed"), result
        return result["router"]

    def health(self) -> dict:
        """Each worker's health as the router says it now, asked from this machine with the key (no Ansible run)."""
        request = urllib.request.Request(self.url + "/workers")
        request.add_header("Authorization", f"Bearer {self.router_host.api_key}")
        with urllib.request.urlopen(request, timeout=10) as response:
            return {worker["url"]: worker["is_healthy"] for worker in json.load(response)["workers"]}

    def worker_url(self, host: LocalHost) -> str:
        return f"http://{host.address}:8000"

    def wait_serving(self, host: LocalHost, timeout: float = 400) -> None:
        """Wait until the host's instance answers /health itself and the router lists it healthy: the router's
        word alone may be one it gave before a restart (a unit of Type=exec is started before vLLM serves)."""
        url = self.worker_url(host)
        deadline = time.monotonic() + timeout
        while not (status_of(url, "/health", fail_with=0) == 200 and self.health().get(url)):
            assert time.monotonic() < deadline, f"{url} did not serve and show healthy at the router within {timeout} s"
            time.sleep(1)

    def worker_urls(self) -> list[str]:
        """Both hosts' workers, in the order the modules give them (by URL)."""
        return sorted(map(self.worker_url, self.fleet.hosts))

    def metrics_after(self, load: StreamingLoad, before: dict) -> dict:
        """The router's counts once they hold every request the client saw answered (the router counts a request
        as its answer ends, which may be after the client has read it), or as they are after METRICS_CATCH_UP s."""
        deadline = time.monotonic() + METRICS_CATCH_UP
        while True:
            after = self.metrics()
            if after["requests"] - before["requests"] >= load.counts()["succeeded"] or time.monotonic() > deadline:
                return after
            time.sleep(0.2)

    def metrics(self) -> dict:
        """The router's own counts for /v1/completions, its retries, and each worker's processed requests."""
        with urllib.request.urlopen(self.metrics_url + "/metrics", timeout=10) as response:
            text = response.read().decode()
        counts = {"requests": 0, "errors": 0, "retries": 0, "workers": {}}
        for line in text.splitlines():
            sample = re.match(r"^(vllm_router_\w+)\{([^}]*)\} (\S+)$", line)
            if not sample:
                continue
            name, labels, value = (
                sample.group(1),
                dict(re.findall(r'(\w+)="([^"]*)"', sample.group(2))),
                float(sample.group(3)),
            )
            if name == "vllm_router_requests_total" and labels.get("route") == "/v1/completions":
                counts["requests"] += int(value)
            elif name == "vllm_router_request_errors_total" and labels.get("route") == "/v1/completions":
                counts["errors"] += int(value)
            elif name == "vllm_router_retries_total":
                counts["retries"] += int(value)
            elif name == "vllm_router_processed_requests_total":
                counts["workers"][labels["worker"]] = int(value)
        return counts

    def load(self, **kwargs) -> StreamingLoad:
        return StreamingLoad(self.url, "tiny", self.router_host.api_key, **{"pause": LOAD_PAUSE, **kwargs})


def settled_count(host: LocalHost, unit: str, since: float, text: str) -> int:
    """The journal lines of `unit` since `since` that hold `text`, once the unit has stopped and two reads a
    moment apart agree (journald writes what a process wrote as it can)."""
    count = f"journalctl -u {unit} --since @{int(since)} -o cat --no-pager | grep -cF {shlex.quote(text)}"
    script = (
        f"for _ in $(seq 600); do case $(systemctl show -p ActiveState --value {unit}) in"
        " active|deactivating) sleep 0.1;; *) break;; esac; done; last=-1"
        f'; for _ in $(seq 50); do now=$({count}); [ "$now" = "$last" ] && echo $now && exit; last=$now'
        "; sleep 0.2; done; exit 1"
    )
    return int(host.sh(script, timeout=120).stdout)


def status_of(url: str, path: str, key: str | None = None, method: str = "GET", fail_with: int | None = None) -> int:
    """The HTTP status of a request from this machine (another address than the router's); where nothing answers,
    `fail_with` if given, else the error is raised."""
    request = urllib.request.Request(url + path, method=method, data=b"" if method == "POST" else None)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        if fail_with is None:
            raise
        return fail_with


@pytest.fixture(scope="module")
def routed(fleet, tmp_path_factory) -> Routed:
    first = fleet.hosts[0]
    inventory = fleet.inventory_with(
        tmp_path_factory.mktemp("router") / "hosts.yml", groups={"vllm_routers": {"hosts": {first.name: ROUTER_VARS}}}
    )
    routed = Routed(fleet, inventory, f"http://{first.address}:{ROUTER_PORT}", f"http://{first.address}:{METRICS_PORT}")
    proc = routed.playbook("playbooks/router.yml")
    assert proc.returncode == 0, f"router.yml failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    yield routed
    first.sh(f"systemctl disable --now {UNIT}")
    # The fleet as the `fleet` fixture gives it to the tests after these: tiny serving on both hosts, no tiny_v2.
    for host in fleet.hosts:
        remove_instances(host, "tiny_v2")
    deploy_tiny(fleet.inventory)


def report(what: str, load: StreamingLoad, seconds: float, before: dict, after: dict) -> None:
    counts = load.counts()
    routed_delta = {key: after[key] - before[key] for key in ("requests", "errors")}
    print(f"{what}: {seconds:.0f} s, client {counts}, router {routed_delta}")


def assert_nothing_lost(load: StreamingLoad, before: dict, after: dict) -> None:
    counts = load.counts()
    failures = [(record.status, record.error, record.body, record.tokens) for record in load.failures()[:5]]
    assert counts["succeeded"] == counts["requests"] > 0, (counts, failures)
    assert (counts["truncated"], counts["no_answer"], counts["other_status"]) == (0, 0, {}), (counts, failures)
    # The router's own metrics agree: every completion it counted, none in error.
    assert after["requests"] - before["requests"] == counts["succeeded"], (before, after, counts)
    assert after["errors"] == before["errors"], (before, after)


def test_router_yml_puts_the_router_in_front_of_both_hosts(routed):
    host = routed.router_host
    router = routed.info()
    assert (router["active_state"], router["served_name"], router["port"]) == ("active", "tiny", ROUTER_PORT)
    assert router["workers"] == [{"url": url, "healthy": True, "load": 0} for url in routed.worker_urls()]
    with routed.load(concurrency=1) as load:
        load.wait_for_successes(4, timeout=120)
    # The unit: its own user, sandboxed; the key in the 0600 EnvironmentFile and nowhere else.
    unit = host.sh(f"systemctl show -p User -p ProtectSystem -p NoNewPrivileges -p MainPID {UNIT}").stdout
    assert "User=vllm-router" in unit and "ProtectSystem=strict" in unit and "NoNewPrivileges=yes" in unit
    assert host.sh("stat -c '%a %U' /etc/vllm-router/router.env").stdout.split() == ["600", "root"]
    main_pid = re.search(r"MainPID=(\d+)", unit).group(1)
    for where in (
        f"cat /etc/systemd/system/{UNIT} /etc/vllm-router/router.json /etc/vllm-router/workers.json",
        f"tr '\\0' ' ' < /proc/{main_pid}/cmdline; ps -eo args",
        f"journalctl --unit {UNIT} --no-pager --output cat",
    ):
        assert host.api_key not in host.sh(where).stdout, where
    last = host.sh(f"systemd-analyze security --no-pager {UNIT}").stdout.strip().splitlines()[-1]
    print(last)
    assert float(re.search(r"([0-9]+\.[0-9]+)", last.split(":")[-1]).group(1)) <= 3.0, last


def test_without_the_key_nothing_of_the_router_answers_another_host(routed):
    key = routed.router_host.api_key
    # From this machine, another address than the router's.
    assert status_of(routed.url, "/v1/models") == 401
    assert status_of(routed.url, "/v1/models", "not-the-key") == 401
    assert status_of(routed.url, "/list_workers") == 401
    assert status_of(routed.url, "/add_worker?url=http://10.88.0.254:8000", method="POST") == 401
    assert status_of(routed.url, "/remove_worker?url=" + routed.worker_url(routed.fleet.hosts[1]), method="POST") == 401
    assert status_of(routed.url, "/v1/models", key) == 200
    # From the second host.
    second = routed.fleet.hosts[1]
    for headers, expected in (({}, 401), ({"Authorization": f"Bearer {key}"}, 200)):
        answer = second.module(
            "ansible.builtin.uri", url=routed.url + "/v1/models", headers=headers, status_code=[200, 401]
        )
        assert answer["status"] == expected, answer
    assert [worker["url"] for worker in routed.info()["workers"]] == routed.worker_urls()


def test_a_second_router_yml_changes_nothing(routed):
    proc = routed.playbook("playbooks/router.yml")
    assert proc.returncode == 0, proc.stdout[-4000:]
    for host in routed.fleet.hosts:
        assert re.search(rf"{host.name} +: ok=[0-9]+ +changed=0 ", proc.stdout), proc.stdout[-3000:]


def test_status_yml_shows_the_router_its_workers_and_their_health(routed):
    proc = routed.playbook("playbooks/status.yml")
    assert proc.returncode == 0, proc.stdout[-4000:]
    host = routed.router_host.name
    for worker in routed.fleet.hosts:
        row = rf"{host} +\| http://127.0.0.1:{ROUTER_PORT} +\| tiny +\| active +\| {routed.worker_url(worker)} +\| "
        assert re.search(row + "healthy ", unfolded(proc)), proc.stdout[-4000:]


def test_a_rollout_of_both_hosts_behind_the_router_loses_no_request(routed):
    """Each host in turn leaves the router, drains, stops, starts tiny_v2 and comes back.

    Without the gate: both hosts share this machine's cores, so a gate between them under the router's load would
    measure that load, not the release; test_gate.py gates a rollout on hosts that serve nothing else."""
    before = routed.metrics()
    started = time.monotonic()
    with routed.load() as load:
        load.wait_for_successes(6, timeout=120)
        proc = routed.playbook(
            "playbooks/rollout.yml", "-e", "model=tiny_v2", "-e", CATALOG, "-e", "vllm_rollout_gate=false"
        )
        load.wait_for_successes(6, timeout=120)
    after = routed.metrics_after(load, before)
    report("rollout of both hosts", load, time.monotonic() - started, before, after)
    assert proc.returncode == 0, f"rollout.yml failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    for host in routed.fleet.hosts:
        swapped = rf"{host.name} +\| tiny +\| tiny_v2 +\| [0-9.]+ +\| swapped "
        assert re.search(swapped, unfolded(proc)), proc.stdout[-4000:]
    assert_nothing_lost(load, before, after)
    # Both hosts serve before and after: the router sent requests to each, and lists both, healthy, again.
    assert all(
        after["workers"][url] > before["workers"].get(url, 0) for url in map(routed.worker_url, routed.fleet.hosts)
    )
    assert [(worker["url"], worker["healthy"]) for worker in routed.info()["workers"]] == [
        (url, True) for url in routed.worker_urls()
    ]


def test_the_entry_rolled_out_found_vllms_answer_about_its_model_class(routed):
    """vLLM imports a model's class in a Python process of its own at an entry's first start unless VLLM_CACHE_ROOT/
    modelinfos answers. The entries of a release share that directory: tiny_v2's first start on each host read the
    answer that tiny's start left there (both are LlamaForCausalLM) and wrote none."""
    for host in routed.fleet.hosts:
        version = json.loads(host.sh(f"cat {host.config_dir}/tiny_v2.json").stdout)["vllm_version"]
        release = f"/var/lib/vllm/.cache/vllm/{version}"
        assert host.sh(f"readlink {release}/tiny_v2/modelinfos").stdout.strip() == "../modelinfos", host.name
        answers = host.sh(f"find {release}/modelinfos -name '*LlamaForCausalLM.json' -printf '%T@\\n'").stdout.split()
        started_at = main_started_at(host, "vllm-tiny_v2.service")
        # An answer that tiny_v2's start wrote would be seconds younger than the start: vLLM imports itself first.
        assert answers and max(map(float, answers)) <= started_at + 1, (host.name, answers, started_at)


def test_a_request_that_reaches_a_draining_instance_is_answered_by_the_other_host(routed):
    """vLLM takes requests while it drains at a stop and serves none of them: the server answers them 503 with
    Retry-After, not 500 or 200 and an empty stream, and the router sends them again. The router still lists the
    draining instance here for the whole drain, as it does for a request it sent just before the instance left it;
    a retry may then land on it again, and once the router's retries are spent the client gets the 503 itself."""
    second = routed.fleet.hosts[1]
    draining_url = routed.worker_url(second)
    # The instance the router lists on the second host: tiny_v2 after the rollout, tiny when run alone.
    unit = second.sh("systemctl list-units --state=active --plain --no-legend 'vllm-tiny*.service'").stdout.split()[0]
    in_flight = StreamingLoad(draining_url, "tiny", second.api_key, concurrency=DRAIN_STREAMS, max_tokens=DRAIN_TOKENS)
    before = routed.metrics()
    with in_flight:
        deadline = time.monotonic() + 120
        while engine_gauge(second, draining_url, "vllm:num_requests_running") < DRAIN_STREAMS // 2:
            assert time.monotonic() < deadline, f"{DRAIN_STREAMS // 2} streams were not running within 120 s"
            time.sleep(0.2)
        in_flight.stop_sending()
        stop_asked = time.time()
        second.sh(f"systemctl stop --no-block {unit}")
        second.sh(
            f"for _ in $(seq 300); do journalctl -u {unit} --since @{int(stop_asked)} -o cat --no-pager"
            f" | grep -qF {shlex.quote(VLLM_DRAINING)} && exit; sleep 0.1; done; exit 1",
            timeout=60,
        )
        direct = StreamingLoad(draining_url, "tiny", second.api_key).send("Draining")
        with routed.load(concurrency=2, pause=0) as load:
            load.wait_for_successes(ROUTED_DURING_DRAIN, timeout=60)
        routed_until = max(record.ended for record in load.snapshot())
    drained = [record for record in in_flight.snapshot() if record.ended > routed_until]
    after = routed.metrics_after(load, before)
    refusals = settled_count(second, unit, stop_asked, ", status 503, ")
    print(
        f"requests sent to a draining instance: direct answer {direct.status}, router client {load.counts()}, "
        f"router {after['retries'] - before['retries']} retries, {refusals} answered 503 by the draining server"
    )
    second.sh(f"systemctl start {unit}")
    routed.wait_serving(second)
    assert (direct.status, direct.retry_after) == (503, "1") and json.loads(direct.body)["error"]["code"] == 503, direct
    # The server was still draining, its streams going, when the router's client had its answers.
    assert drained, "the draining server's streams all ended before the router's requests"
    # Besides the direct request, the router's attempts at the draining server: answered 503, and sent again.
    assert refusals >= 2 and after["retries"] > before["retries"], (refusals, before, after)
    # What the client gets is a completion, or, once the router's retries (which may land on the draining server
    # again while it lists it) are spent, the server's 503 itself: never a 200 without tokens, never a reset.
    counts, failures = load.counts(), load.failures()
    assert counts["succeeded"] >= ROUTED_DURING_DRAIN and (counts["truncated"], counts["no_answer"]) == (0, 0), counts
    assert all(record.status == 503 and "ServiceUnavailableError" in record.body for record in failures), failures


def test_a_killed_engine_core_under_load_leaves_the_router_within_its_health_check_bound(routed):
    """The requests in flight on the killed engine fail, a bounded number; then none does."""
    second = routed.fleet.hosts[1]
    killed_url = routed.worker_url(second)
    routed.wait_serving(second)
    main_pid = second.sh("systemctl show -p MainPID --value vllm-tiny_v2.service").stdout.strip()
    with routed.load() as load:
        load.wait_for_successes(6, timeout=120)
        engine = second.sh(f"pgrep --parent {main_pid} --full '^VLLM::EngineCore'").stdout.split()
        assert engine, "no EngineCore under the unit's main process"
        killed_at = time.monotonic()
        second.sh(f"kill -KILL {engine[0]}")
        unhealthy_at = None
        while time.monotonic() - killed_at < 60 and unhealthy_at is None:
            unhealthy_at = time.monotonic() if routed.health().get(killed_url) is False else None
            time.sleep(0.2)
        assert unhealthy_at is not None, "the router did not mark the killed worker unhealthy within 60 s"
        load.wait_for_successes(6, timeout=120)
        # systemd brings the unit back; the router takes the worker again once it answers /health.
        back_at = None
        while time.monotonic() - killed_at < 400 and back_at is None:
            back_at = time.monotonic() if routed.health().get(killed_url) else None
            time.sleep(1)
        assert back_at is not None, "the worker did not come back healthy within 400 s"
        load.wait_for_successes(6, timeout=120)
    failures = load.failures()
    counts = load.counts()
    last_failure = max((record.started - killed_at for record in failures), default=None)
    print(
        f"killed engine core: router marked it unhealthy {unhealthy_at - killed_at:.1f} s after (bound "
        f"{HEALTH_BOUND} s, read every 0.2 s), back {back_at - killed_at:.0f} s after; client {counts}; "
        f"last failed request started {last_failure} s after the kill"
    )
    assert unhealthy_at - killed_at <= HEALTH_BOUND + 2
    # Bounded, not zero: what was in flight on the killed engine, and what the
    # router sent it before it knew, less what it retried on the other worker.
    assert len(failures) <= load.concurrency * 4, counts
    assert all(record.started - killed_at <= HEALTH_BOUND + 2 for record in failures), last_failure


def test_stop_yml_of_one_host_behind_the_router_loses_no_request(routed):
    """The second host leaves the router, drains and stops; the first serves every request."""
    second = routed.fleet.hosts[1]
    before = routed.metrics()
    started = time.monotonic()
    with routed.load() as load:
        load.wait_for_successes(6, timeout=120)
        proc = routed.playbook("playbooks/stop.yml", "-e", "instance=tiny_v2", "--limit", second.name)
        load.wait_for_successes(6, timeout=120)
    after = routed.metrics_after(load, before)
    report("stop.yml of the second host", load, time.monotonic() - started, before, after)
    assert proc.returncode == 0, f"stop.yml failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert_nothing_lost(load, before, after)
    assert [(worker["url"], worker["healthy"]) for worker in routed.info()["workers"]] == [
        (routed.worker_url(routed.fleet.hosts[0]), True)
    ]


def test_a_router_that_does_not_answer_refuses_a_swap_and_a_stop_before_any_change(routed):
    """Nothing is stopped that the router would still send requests to."""
    first = routed.router_host
    pid = first.sh("systemctl show -p MainPID --value vllm-tiny_v2.service").stdout.strip()
    first.sh(f"systemctl stop {UNIT}")
    try:
        swap = routed.playbook("playbooks/swap.yml", "-e", "model=tiny", "--limit", first.name)
        stop = routed.playbook("playbooks/stop.yml", "-e", "instance=tiny_v2", "--limit", first.name)
    finally:
        first.sh(f"systemctl start {UNIT}")
    for proc in (swap, stop):
        output = unfolded(proc)
        assert proc.returncode != 0, output[-4000:]
        assert f"the router on {first.name} does not answer" in output, output[-4000:]
        assert "nothing changed" in output
    assert first.sh("systemctl show -p MainPID --value vllm-tiny_v2.service").stdout.strip() == pid
    result = first.module("llmops.vllm.vllm_router_info", wait=60)
    assert not result.get("failed"), result
    assert [worker["url"] for worker in result["router"]["workers"]] == [routed.worker_url(first)]


def test_an_instance_that_no_record_names_is_refused_before_any_change(routed):
    proc = routed.playbook("playbooks/router.yml", "-e", '{"vllm_router_instances": ["tiny_v3"]}')
    output = unfolded(proc)
    assert proc.returncode != 0, output[-4000:]
    assert "No instance record for tiny_v3" in output
    assert "TASK [llmops.vllm.vllm_router : Install" not in proc.stdout
    assert [worker["url"] for worker in routed.info()["workers"]] == [routed.worker_url(routed.router_host)]


def test_one_host_behind_the_router_swapped_gives_clients_a_clear_retryable_answer(routed):
    """With its one worker out, the router answers 503 at once; never a refused connection."""
    first = routed.router_host
    with routed.load(retry_503=True) as load:
        load.wait_for_successes(6, timeout=120)
        swap_began, swap_began_at = time.monotonic(), time.time()
        proc = routed.playbook("playbooks/swap.yml", "-e", "model=tiny", "--limit", first.name)
        load.wait_for_successes(6, timeout=120)
    assert proc.returncode == 0, f"swap.yml failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    requests = sorted(load.snapshot(), key=lambda record: record.started)
    unavailable = [record for record in requests if record.status == 503]
    counts = load.counts()
    assert unavailable, counts
    assert set(counts["other_status"]) == {503} and all("No available workers" in r.body for r in unavailable)
    # Each unanswered request: when it began and ended, in seconds from the swap's start, and what the client met.
    unanswered = [(round(r.started - swap_began, 3), round(r.ended - swap_began, 3), r.error) for r in load.failures()
                  if r.status is None]  # fmt: skip
    # On a failure, what the router itself said from the swap's start: its warnings, errors and panics.
    router_said = f"journalctl -u {UNIT} --since @{int(swap_began_at)} -o short-precise | grep -E 'WARN|ERR|panick'"
    assert (counts["truncated"], counts["no_answer"]) == (0, 0), (counts, unanswered, first.sh(router_said).stdout)
    last_before = max(
        record.ended for record in requests if load.succeeded(record) and record.ended <= unavailable[0].started
    )
    first_after = min(
        record.ended for record in requests if load.succeeded(record) and record.started >= unavailable[-1].ended
    )
    waits = [record.ended - record.started for record in unavailable]
    first_served = [record.ended - record.started for record in requests if record.started >= unavailable[-1].ended]
    print(
        f"one host swapped behind the router: no completion for {first_after - last_before:.1f} s; "
        f"{len(unavailable)} answers 503 in {max(waits):.3f} s at most; the new instance's first three requests "
        f"took {', '.join(f'{seconds:.2f}' for seconds in first_served[:3])} s; client {counts}"
    )
    assert max(waits) <= 60  # the router's queue timeout


# Prometheus's instant query on the host, from the host's own Python: the series of each expression.
PROMETHEUS_QUERY = r"""
import json, sys, urllib.parse, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
url = "http://localhost:9090/api/v1/query?" + urllib.parse.urlencode({"query": sys.argv[1]})
print(json.dumps(json.load(opener.open(url, timeout=10))["data"]["result"]))
"""
# Prometheus reads the router every 2 s and evaluates every second; the alert holds 2 s. The bound covers the
# router's health checks (HEALTH_BOUND), a scrape, the hold and a loaded 2-core machine.
MONITORING = {
    "vllm_prometheus_scrape_interval": "2s",
    "vllm_prometheus_scrape_timeout": "2s",
    "vllm_prometheus_evaluation_interval": "1s",
    "vllm_prometheus_alerts": {"router_no_healthy_worker": {"for": "2s"}},
}
ALERT_BOUND = 60


def wait_for_series(host: LocalHost, expr: str, present: bool = True, timeout: float = ALERT_BOUND) -> float:
    """Seconds until Prometheus's query `expr` returns a series (or, not `present`, none)."""
    started = time.monotonic()
    while True:
        series = json.loads(host.sh(f"python3 -c {shlex.quote(PROMETHEUS_QUERY)} {shlex.quote(expr)}").stdout)
        if bool(series) == present:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, f"{expr} {'never' if present else 'still'} answered in {timeout} s"
        time.sleep(0.5)


def signal_instances(hosts, signal: str) -> None:
    """Send `signal` to the API server of every running instance on `hosts` (the router's workers among them)."""
    for host in hosts:
        host.sh(
            "for unit in $(systemctl list-units --state=active --plain --no-legend 'vllm-*.service' | awk '{print $1}'"
            f" | grep -vx {UNIT}); do systemctl kill --kill-whom=main --signal={signal} $unit; done"
        )


def test_prometheus_scrapes_the_router_and_fires_when_it_has_no_healthy_worker(routed, tmp_path):
    """monitoring.yml publishes the router as a target of its own job; with every worker's API server stopped
    (SIGSTOP: /health times out), VllmRouterNoHealthyWorker fires, and it clears once they answer again."""
    first = routed.router_host
    inventory = json.loads(routed.inventory.read_text())
    inventory["vllm_monitoring"] = {"hosts": {first.name: {}}}
    (tmp_path / "hosts.yml").write_text(json.dumps(inventory))
    # The router's host alone: it is the monitoring host, and its own router's target is the one asked for.
    proc = routed.fleet.playbook(
        "playbooks/monitoring.yml",
        "--limit",
        first.name,
        "-e",
        json.dumps(MONITORING),
        inventory=tmp_path / "hosts.yml",
    )
    assert proc.returncode == 0, f"monitoring.yml failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    try:
        targets = json.loads(first.sh(f"cat /etc/prometheus/vllm-targets/vllm-router/{first.name}.json").stdout)
        assert targets == [{"targets": [f"127.0.0.1:{METRICS_PORT}"], "labels": {"host": first.name}}]
        healthy = [url for url, is_healthy in routed.health().items() if is_healthy]
        assert healthy, routed.health()
        health = f'vllm_router_worker_health{{job="vllm-router", host="{first.name}"}}'
        scraped = wait_for_series(first, f"count({health} == 1) == {len(healthy)}")
        firing = f'ALERTS{{alertname="VllmRouterNoHealthyWorker", alertstate="firing", host="{first.name}"}}'
        try:
            signal_instances(routed.fleet.hosts, "SIGSTOP")
            fired = wait_for_series(first, firing)
        finally:
            signal_instances(routed.fleet.hosts, "SIGCONT")
        cleared = wait_for_series(first, firing, present=False)
        print(
            f"router scraped with {len(healthy)} healthy worker(s) {scraped:.1f} s after monitoring.yml; its workers "
            f"stopped: VllmRouterNoHealthyWorker fired after {fired:.1f} s, cleared {cleared:.1f} s after they went on"
        )
        deadline = time.monotonic() + ALERT_BOUND
        while not all(routed.health().get(url) for url in healthy):
            assert time.monotonic() < deadline, f"the workers were not healthy again within {ALERT_BOUND} s"
            time.sleep(0.5)
    finally:
        first.sh("systemctl disable --now prometheus")
