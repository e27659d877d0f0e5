"""vllm_service against the real vLLM serving `tiny` under systemd on the local host.

The tests leave the unit serving as they found it; those that change the unit do so with a drop-in that
they remove again.
"""

import json
import shlex
import time
from pathlib import Path

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.service.lifecycle import (
    ENGINE_EXIT_GRACE,
    JOURNAL_CATCH_UP,
    STOP_POLL_INTERVAL,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.vllm_api import REQUEST_TIMEOUT

from .conftest import copy_stream_clients

UNIT = "vllm-tiny.service"
UNIT_FILE = f"/etc/systemd/system/{UNIT}"
DROP_IN = f"/etc/systemd/system/{UNIT}.d/test.conf"
# Tokens per streamed request: 3 streams of 500 take about 1 s on 2 cores, well inside tiny's 10 s drain.
STREAM_TOKENS = 500
# Streams kept going at once.
STREAMS = 3
# Streams of requests so short that each stream spends a good part of its time between two of them.
SHORT_STREAMS = 8
SHORT_TOKENS = 24
# Seconds that one process the module runs on the host (systemctl show, journalctl) may take on a busy 2-core
# host, with its reads of /proc and the cgroup. Measured in the test host beside four CPU-bound processes on the
# machine's 2 cores (load 3): systemctl show 0.007 s median, 0.017 s at most (idle: 0.005 and 0.011 s). 1 s
# leaves room for hosts far busier than that.
BUSY_CALL = 1.0


def service(host, state, **args):
    args.setdefault("served_name", "tiny")
    return host.module("llmops.vllm.vllm_service", name=UNIT, state=state, api_key=host.api_key, **args)


def succeeded(result):
    assert not result.get("failed"), result.get("msg")
    return result


def unit_show(host, *properties):
    text = host.sh(f"systemctl show {UNIT} -p {','.join(properties)}").stdout
    return dict(line.split("=", 1) for line in text.splitlines())


def session_processes(host, session):
    """`pid name` lines of the processes in a session."""
    return host.sh(f"ps -eo pid=,sid=,comm= | awk '$2 == {session} {{print $1, $3}}'").stdout.split("\n")[:-1]


def start_streams(host, count, output, tokens=STREAM_TOKENS):
    """Start `count` streams of requests of `tokens` tokens on the host; return once each has received a chunk."""
    copy_stream_clients(host)
    command = f"python3 /tmp/stream_clients.py {host.endpoint} tiny {host.api_key} {count} {tokens} {output}"
    host.sh(f"rm -f {output} {output}.streaming")
    host.spawn(command)
    host.sh(f"for _ in $(seq 600); do test -e {output}.streaming && exit; sleep 0.1; done; exit 1", timeout=90)


def stream_records(host, output):
    for _attempt in range(120):
        found = host.sh(f"cat {output}", check=False)
        if found.returncode == 0:
            return json.loads(found.stdout)
        time.sleep(0.5)
    raise AssertionError(f"the stream clients wrote no {output}")


@pytest.fixture
def serving(deployed):
    """The deployed host with tiny serving before and after the test."""
    succeeded(service(deployed, "started", load_timeout=300))
    yield deployed
    if deployed.sh(f"test -e {DROP_IN}", check=False).returncode == 0:
        deployed.sh(f"rm -rf {UNIT_FILE}.d")
        succeeded(service(deployed, "restarted", load_timeout=300))
    else:
        succeeded(service(deployed, "started", load_timeout=300))


def write_drop_in(host, *lines):
    host.sh(
        f"mkdir -p {UNIT_FILE}.d && printf '%s\\n' '[Service]' {' '.join(repr(line) for line in lines)} > {DROP_IN}"
    )


def exec_start_with(host, old, new):
    """The unit's ExecStart= line with one piece of it replaced (a drop-in needs an empty ExecStart= first)."""
    line = host.sh(f"grep '^ExecStart=' {UNIT_FILE}").stdout.strip()
    assert old in line
    return ["ExecStart=", line.replace(old, new)]


# ---- bad input: a clear error, and the host unchanged ----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"name": "vllm-nonexistent"}, "systemd does not know the unit vllm-nonexistent.service"),
        ({"url": "localhost:8000"}, "url must be the server's base URL"),
        ({"url": "http://127.0.0.1:8000/metrics"}, "without a path beyond /v1"),
        ({"stop_timeout": 0}, "stop_timeout must be more than 0 seconds"),
        ({"load_timeout": -5}, "load_timeout must be more than 0 seconds"),
        ({"drain_timeout": -1}, "drain_timeout must be 0 (no drain) or more seconds"),
    ],
)
def test_bad_input_fails_clearly_and_changes_nothing(serving, args, message):
    main_pid = unit_show(serving, "MainPID")["MainPID"]
    result = serving.module("llmops.vllm.vllm_service", **{"name": UNIT, "state": "stopped", **args})
    assert result.get("failed") and message in result["msg"]
    assert unit_show(serving, "ActiveState", "MainPID") == {"ActiveState": "active", "MainPID": main_pid}


def test_a_served_name_the_server_does_not_list_fails_at_once(serving):
    result = service(serving, "started", served_name="not-tiny", load_timeout=300)
    assert result.get("failed")
    assert "serves ['tiny'], not 'not-tiny': check served_name" in result["msg"]
    # At once: at the first answer of /v1/models, not at load_timeout (300 s). Before it fails, the module
    # waits for three HTTP answers at most (/is_sleeping, /health, /v1/models), for the journal's last lines
    # (JOURNAL_CATCH_UP, read every 0.5 s) and for about ten systemctl and journalctl calls.
    assert result["elapsed"] < 3 * REQUEST_TIMEOUT + JOURNAL_CATCH_UP + 10 * BUSY_CALL


def test_check_mode_predicts_a_stop_and_sends_nothing(serving):
    main_pid = unit_show(serving, "MainPID")["MainPID"]
    result = succeeded(service(serving, "stopped", check_mode=True))
    assert result["changed"] and result["stop"] is None
    assert unit_show(serving, "ActiveState", "MainPID") == {"ActiveState": "active", "MainPID": main_pid}


# ---- stop and start of the real server ------------------------------------------------------------------


def test_idle_stop_returns_when_vllm_exits_and_start_splits_its_time(serving):
    stopped = succeeded(service(serving, "stopped"))
    stop = stopped["stop"]
    assert stopped["changed"] and stopped["active_state"] == "inactive"
    assert stop["terminate"]["stopped"] and not stop["escalated"] and stop["cgroup_empty"]
    assert stop["orphans"]["found"] == [] and stop["aborted_requests"] == 0
    # systemd's own record of the stop: from leaving `active` to reaching `inactive`.
    times = unit_show(serving, "ActiveExitTimestampMonotonic", "InactiveEnterTimestampMonotonic")
    vllm_exit = (int(times["InactiveEnterTimestampMonotonic"]) - int(times["ActiveExitTimestampMonotonic"])) / 1e6
    print(f"idle stop: {stop['elapsed']} s, vLLM's own exit as systemd records it {vllm_exit:.2f} s")
    # The module's wait ended once systemd had recorded the stop, not before: its last look saw the unit
    # inactive (a bound in seconds below vllm_exit would have to allow for systemctl's own return on a busy
    # host, and would then no longer prove it).
    assert stop["terminate"]["active_state"] == "inactive", stop
    # ...and not long after: within two polls (STOP_POLL_INTERVAL apart, each a systemctl call) of it, the
    # drain included (an unreadable request count, which a busy server gives, is watched as a drain).
    drain = stop["drain"]["elapsed"] if stop["drain"] else 0
    assert drain + stop["terminate"]["elapsed"] < vllm_exit + 2 * (STOP_POLL_INTERVAL + BUSY_CALL), (vllm_exit, stop)

    again = succeeded(service(serving, "stopped"))
    assert not again["changed"] and again["stop"]["terminate"] is None

    started = succeeded(service(serving, "started", load_timeout=300))
    start = started["start"]
    print(f"start: systemd {start['systemd_start']} s, model load {start['load']} s")
    assert started["changed"] and started["active_state"] == "active"
    assert start["systemd_start"] < 5 < start["load"]
    assert start["elapsed"] == pytest.approx(start["systemd_start"] + start["load"], abs=0.01)
    assert not succeeded(service(serving, "started"))["changed"]


def test_drained_stop_lets_in_flight_requests_complete(serving):
    start_streams(serving, STREAMS, "/tmp/drained.json")
    stop = succeeded(service(serving, "stopped"))["stop"]  # the server's own --shutdown-timeout 10
    print(f"drained stop: {stop['in_flight']} in flight, drain {stop['drain']}, stop {stop['elapsed']} s")
    # The module watches the drain when vLLM's gauges showed requests just before SIGTERM; vLLM drains them
    # whatever a reading of an instant showed, and the count below is the server's own.
    assert stop["drain"] is None or stop["drain"]["remaining"] == 0, stop
    assert (stop["aborted_requests"], stop["aborted_requests_bound"], stop["escalated"]) == (0, "exact", False)
    records = stream_records(serving, "/tmp/drained.json")
    # Every request the server had begun to answer completed; the later ones were refused, not cut.
    answered = [record for record in records if record["chunks"]]
    assert len(answered) >= STREAMS
    for record in answered:
        expected = {"status": 200, "done": True, "tokens": STREAM_TOKENS, "finish_reason": "length", "error": None}
        assert record == {**record, **expected}


def one_completion(host, prompt):
    """One streamed completion of 16 tokens from inside the host: stream_clients.py's record of it."""
    copy_stream_clients(host)
    command = f"python3 /tmp/stream_clients.py --one {host.endpoint} tiny {host.api_key} 16 {shlex.quote(prompt)}"
    return json.loads(host.sh(command, timeout=90).stdout)


def test_a_first_prompt_of_one_or_two_tokens_serves_after_a_fresh_start(serving):
    """On a CPU with AMX, vLLM's CPU build killed its worker (SIGILL) on such a first batch: see docs/service.md."""
    succeeded(service(serving, "restarted", load_timeout=300))
    for prompt in ("a", "ab"):
        record = one_completion(serving, prompt)
        expected = {"status": 200, "tokens": 16, "done": True, "finish_reason": "length", "error": None}
        assert record == {**record, **expected}
        # vLLM streams a chunk per token, or fewer when its API server falls behind the engine and merges them.
        assert 1 <= record["chunks"] <= 16 and record["prompt_tokens"] <= 2
    assert unit_show(serving, "NRestarts", "ActiveState") == {"NRestarts": "0", "ActiveState": "active"}


def test_a_killed_engine_core_brings_the_unit_back_serving(serving):
    """vLLM exits 0 once its engine is gone; the unit restarts it, and the module says what happened."""
    before = unit_show(serving, "InvocationID", "MainPID", "NRestarts")
    engine = serving.sh(f"pgrep --parent {before['MainPID']} --full '^VLLM::EngineCore'").stdout.split()
    assert len(engine) == 1, engine
    killed_at = time.monotonic()
    serving.sh(f"kill -KILL {engine[0]}")
    # systemd's restart: a new run of the unit, counted as an automatic restart (RestartSec 10 s, then the load).
    deadline = killed_at + 300 + 10
    while time.monotonic() < deadline:
        now = unit_show(serving, "InvocationID", "NRestarts", "ActiveState")
        if now["InvocationID"] != before["InvocationID"] and now["ActiveState"] == "active":
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"the unit did not start again within 310 s of the engine's death: {now}")
    assert int(now["NRestarts"]) == int(before["NRestarts"]) + 1
    result = succeeded(service(serving, "started", load_timeout=300))
    serving_at = time.monotonic()
    print(f"engine killed: serving again {serving_at - killed_at:.1f} s later ({result['msg']})")
    assert not result["changed"]  # systemd started it, not the module
    assert result["engine_death"] == "the engine died: engine core exited unexpectedly"
    assert result["restarts"] == int(now["NRestarts"]) and "its last run ended because the engine died" in result["msg"]
    assert one_completion(serving, "ab")["tokens"] == 16


STALLED_CLIENT = Path(__file__).with_name("stalled_client.py")
# Bytes queued on the server's side of the stalled connection once the API server has to wait for it.
STALLED_BYTES = 1_000_000
# vLLM's own line when its HTTP server waits for connections at a stop.
WAITING_FOR_CONNECTIONS = "Waiting for connections to close"


def send_queue_on_port(host, port):
    """The largest send queue (bytes) of an established connection on local `port`, from /proc/net/tcp."""
    table = host.sh("cat /proc/net/tcp /proc/net/tcp6").stdout.splitlines()
    queues = [
        int(fields[4].split(":")[0], 16)
        for fields in (row.split() for row in table)
        if len(fields) > 4 and fields[1].endswith(f":{port:04X}") and fields[3] == "01"
    ]
    return max(queues, default=0)


def test_an_api_server_that_outlives_its_engine_is_ended_at_once(serving):
    """A client that stopped reading: vLLM's engine exits at the stop, its API server waits for the client.

    On the GPU the same wait follows streams in flight (docs/service.md); no CPU release shows that one, so
    a stalled client makes the API server outlive its engine here. The module kills it once the connection has
    stayed open ENGINE_EXIT_GRACE s after the engine's exit; before, it waited stop_timeout and then sent SIGKILL.
    The stop timeout is long, so that a kill by the timeout cannot pass for a kill by the hang's detection however
    slow the host.
    """
    serving.sh(f"cat > /tmp/stalled_client.py <<'EOF'\n{STALLED_CLIENT.read_text()}\nEOF")
    serving.spawn(f"python3 /tmp/stalled_client.py {serving.endpoint} tiny {serving.api_key} 300")
    deadline = time.monotonic() + 120
    while send_queue_on_port(serving, 8000) < STALLED_BYTES:
        assert time.monotonic() < deadline, "the stalled client's answer did not back up within 120 s"
        time.sleep(0.5)
    stop_timeout = 300
    result = succeeded(service(serving, "stopped", stop_timeout=stop_timeout))
    stop = result["stop"]
    hang = stop["api_server_hang"]
    print(f"API server outliving its engine: stop {stop['elapsed']} s, {hang}, msg {result['msg']!r}")
    # vLLM did wait for the connection: the line is in the journal, or arrives there (journald reads a service's
    # output as it can).
    journal = f"journalctl -u {UNIT} -n 200 -o cat --no-pager"
    serving.sh(
        f"for _ in $(seq 50); do {journal} | grep -qF {shlex.quote(WAITING_FOR_CONNECTIONS)} && exit; sleep 0.2; done"
        "; exit 1"
    )
    assert hang["connections"] >= 1 and stop["escalated"] and stop["cgroup_empty"]
    # Asked before the kill, the server wrote the stalled request as still open: the one request it aborted.
    assert (stop["aborted_requests"], stop["aborted_requests_bound"], stop["refused_requests"]) == (1, "exact", 0)
    # Killed for the hang, after its grace, not by the stop timeout.
    assert hang["killed_after"] - hang["engine_exited"] >= ENGINE_EXIT_GRACE, hang
    assert stop["terminate"]["elapsed"] < stop_timeout, stop["terminate"]
    assert "the API server did not exit after its engine stopped; " in result["msg"]
    assert result["active_state"] == "inactive"


def test_hung_unit_is_killed_at_stop_timeout(local_host):
    """A main process and its child that both ignore SIGTERM: SIGKILL to the cgroup after stop_timeout."""
    hang = "llmops-test-hang.service"
    program = "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); os.fork(); time.sleep(3600)"
    local_host.sh(
        f"printf '%s\\n' '[Service]' 'ExecStart=/usr/bin/python3 -c \"{program}\"' > /etc/systemd/system/{hang}"
        f" && systemctl daemon-reload && systemctl start {hang} && sleep 1"
    )
    try:
        result = local_host.module("llmops.vllm.vllm_service", name=hang, state="stopped", stop_timeout=3)
        stop = succeeded(result)["stop"]
        print(f"hung unit, stop_timeout 3: stopped in {stop['elapsed']} s, killed {stop['killed']}")
        assert stop["escalated"] and len(stop["killed"]) == 2 and stop["cgroup_empty"]
        # SIGKILL at stop_timeout: the wait for the exit ends at its deadline (its last poll there, one
        # systemctl call), neither before it nor at systemd's TimeoutStopSec (90 s).
        assert 3 <= stop["terminate"]["elapsed"] < 3 + STOP_POLL_INTERVAL + BUSY_CALL, stop
        # The whole stop: the request count read first (/metrics at the default URL, where tiny may answer),
        # that wait, and the SIGKILL until systemd saw the unit stop and the orphan search (a few polls).
        assert 3 <= stop["elapsed"] < REQUEST_TIMEOUT + 3 + 5 * (STOP_POLL_INTERVAL + BUSY_CALL), stop
        # The SIGKILL left the unit failed, which would make the host read `degraded`: the stop reset it.
        assert result["reset_failed"].startswith("result signal, "), result
        assert result["active_state"] == "inactive"
        assert local_host.sh(f"systemctl is-failed {hang}", check=False).stdout.strip() == "inactive"
    finally:
        # Whatever the module did: a failed unit would leave the host's systemd `degraded` for the next test.
        local_host.sh(f"systemctl stop {hang}; systemctl reset-failed {hang}; rm -f /etc/systemd/system/{hang}; true")
        local_host.sh("systemctl daemon-reload")


def test_bad_serve_flag_fails_fast_with_the_journal(serving):
    write_drop_in(serving, *exec_start_with(serving, "--shutdown-timeout", "--no-such-flag --shutdown-timeout"))
    result = service(serving, "restarted", load_timeout=300)
    assert result.get("failed") and result["daemon_reloaded"]
    assert "failed while loading" in result["msg"]
    assert "unrecognized arguments: --no-such-flag" in result["msg"]
    assert result["elapsed"] < 120  # the failure, not the 300 s load timeout


@pytest.fixture(scope="module")
def careless_drop_in(deployed):
    """tiny without a drain (--shutdown-timeout 0) and with KillMode=process, as a hand-written unit might be:
    written once for the tests below, and removed after them."""
    succeeded(service(deployed, "started", load_timeout=300))
    write_drop_in(
        deployed, *exec_start_with(deployed, "--shutdown-timeout 10", "--shutdown-timeout 0"), "KillMode=process"
    )
    restarted = succeeded(service(deployed, "restarted", load_timeout=300))
    assert restarted["daemon_reloaded"]
    yield deployed
    deployed.sh(f"rm -rf {UNIT_FILE}.d")
    succeeded(service(deployed, "restarted", load_timeout=300))


@pytest.fixture
def careless_unit(careless_drop_in):
    """The careless tiny, serving: started again when a test before stopped it."""
    succeeded(service(careless_drop_in, "started", load_timeout=300))
    return careless_drop_in


def test_without_drain_every_request_cut_off_is_counted(careless_unit):
    """Short requests one after another on each stream, so that whenever the stop begins some have only just
    reached the server: in the API server still, or in the engine but not yet in its gauges. None is missed."""
    start_streams(careless_unit, SHORT_STREAMS, "/tmp/aborted.json", SHORT_TOKENS)
    result = succeeded(service(careless_unit, "stopped"))
    records = stream_records(careless_unit, "/tmp/aborted.json")
    stop = result["stop"]
    # Begun but not finished: vLLM closes some such streams with an error event and [DONE], others not at all.
    cut_off = [record for record in records if record["chunks"] and record["tokens"] != SHORT_TOKENS]
    # Every request not finished, answered or not: a stream ends at its first, so at most one a stream. Those the
    # server refused after SIGTERM are among them; so are those it had queued before, which no client can tell.
    unfinished = [record for record in records if record["tokens"] != SHORT_TOKENS]
    aborted, refused = stop["aborted_requests"], stop["refused_requests"]
    counts = f"{aborted} aborted, {refused} refused, {len(cut_off)} cut off, {len(unfinished)} unfinished"
    print(f"stop without drain: {counts}")
    assert stop["drain"] is None and stop["aborted_requests_bound"] == "exact", stop
    # The streams run in step (one length each), so a stop may find every one at the start of a new request: one
    # that reached the server before SIGTERM, with no chunk yet (aborted, not cut off), or one that came after it
    # (refused). Each unfinished request is at most one of them.
    assert len(unfinished) >= 1, records
    assert len(unfinished) >= aborted + refused and aborted >= len(cut_off), (stop, len(unfinished), len(cut_off))
    assert (f"{aborted} requests aborted" in result["msg"]) == (aborted > 0), result["msg"]
    assert (f"{refused} requests that came after SIGTERM refused" in result["msg"]) == (refused > 0), result["msg"]
    # A stream vLLM closes with its usage chunk says why: its requests were aborted, not finished.
    assert all(record["tokens"] is None or record["finish_reason"] == "abort" for record in cut_off), cut_off


def test_orphans_of_a_killed_main_process_are_found_and_killed(careless_unit):
    main_pid = unit_show(careless_unit, "MainPID")["MainPID"]
    assert len(session_processes(careless_unit, main_pid)) >= 3  # API server, EngineCore, worker, tracker
    careless_unit.sh(f"kill -KILL {main_pid}")
    result = succeeded(service(careless_unit, "stopped"))  # kill_orphans is true unless set otherwise
    orphans = result["stop"]["orphans"]
    # The command line, not the name: the kernel cuts a process's name (comm) to 15 characters.
    commands = {process["cmdline"] for process in orphans["found"]}
    assert "VLLM::EngineCore" in commands and all(process["session"] == int(main_pid) for process in orphans["found"])
    assert sorted(orphans["terminated"] + orphans["killed"]) == sorted(process["pid"] for process in orphans["found"])
    assert orphans["survivors"] == [] and result["stop"]["cgroup_empty"]
    assert session_processes(careless_unit, main_pid) == []
