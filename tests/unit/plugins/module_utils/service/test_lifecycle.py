"""The lifecycle's state machine, with systemd's answers scripted and a real HTTP server for readiness."""

import http.server
import json
import threading

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.service.lifecycle import (
    Lifecycle,
    ServiceError,
    Settings,
    server_drain_timeout,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import parse_show


def state(active, sub="running", invocation="b", result="success", code="1", status="0", main_pid=100):
    return parse_show(
        "vllm-tiny.service",
        f"LoadState=loaded\nActiveState={active}\nSubState={sub}\nResult={result}\nInvocationID={invocation}\n"
        f"ExecMainCode={code}\nExecMainStatus={status}\nMainPID={main_pid}\n",
    )


class ScriptedUnit:
    """A unit whose `systemctl show` answers come from a list; the last answer repeats."""

    name = "vllm-tiny.service"

    def __init__(self, *states, journal=()):
        self.states = list(states)
        self.calls = []
        self.lines = list(journal)

    def state(self):
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def reset_failed(self):
        self.calls.append("reset-failed")

    def start(self):
        self.calls.append("start")

    def journal(self, invocation_id, lines):
        return self.lines[-lines:]


class _Server(http.server.BaseHTTPRequestHandler):
    models = ["tiny"]

    def do_GET(self):
        body = json.dumps({"data": [{"id": name} for name in self.models]}) if self.path == "/v1/models" else ""
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


class _GroupServer(_Server):
    """A group's API server whose data parallel rank 1 has no engine: the completions handed to it fail."""

    ranks_asked = []

    def do_POST(self):
        rank = self.headers.get("X-data-parallel-rank")
        self.ranks_asked.append(rank)
        self.send_response(500 if rank == "1" else 200)
        self.end_headers()
        self.wfile.write(b"{}")


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def lifecycle(unit, url, **settings):
    return Lifecycle(unit, Settings(url=url, served_name="tiny", poll_interval=0.01, load_timeout=5, **settings))


def test_start_waits_for_a_queued_job_then_splits_its_time(server):
    before = state("inactive", "dead", invocation="a")
    # The start job is queued (same invocation), then the unit activates, then it is active and serves.
    unit = ScriptedUnit(before, state("activating", "start"), state("active"))
    timings = lifecycle(unit, server).start(before)
    assert unit.calls == ["reset-failed", "start"]
    assert timings["elapsed"] == pytest.approx(timings["systemd_start"] + timings["load"], abs=0.002)


def test_start_fails_at_once_when_the_server_dies_while_loading(server):
    before = state("inactive", "dead", invocation="a")
    crashed = state("activating", "auto-restart", result="exit-code", status="1")
    journal = ["INFO loading", "ValueError: unrecognized arguments: --no-such-flag", "INFO exiting"]
    unit = ScriptedUnit(before, crashed, journal=journal)
    with pytest.raises(ServiceError) as failure:
        lifecycle(unit, "http://127.0.0.1:9").start(before)
    message = str(failure.value)
    assert message.startswith(
        "vllm-tiny.service failed while loading: result exit-code, main process exited with status 1"
    )
    assert "unrecognized arguments: --no-such-flag" in message.split("Errors in its journal")[1]
    assert failure.value.details["elapsed"] < 1 and failure.value.details["journal"] == journal


def test_a_start_whose_engine_died_says_so_first(server):
    before = state("inactive", "dead", invocation="a")
    restarting = state("activating", "auto-restart", result="success", status="0")
    journal = [
        "(EngineCore pid=3732) ERROR 12-02 06:07:53 [multiproc_executor.py:315] Worker proc VllmWorker-0 died"
        " unexpectedly (exit code: -4), shutting down executor.",
        "(EngineCore pid=3732) ERROR 12-02 06:07:53 [core.py:1512] EngineCore encountered a fatal error.",
    ]
    with pytest.raises(ServiceError) as failure:
        lifecycle(ScriptedUnit(before, restarting, journal=journal), "http://127.0.0.1:9").start(before)
    lines = str(failure.value).splitlines()
    assert lines[0].endswith("main process exited with status 0")
    assert lines[1] == "the engine died: Worker proc VllmWorker-0 died unexpectedly (exit code: -4, SIGILL)"


def test_start_fails_when_the_new_run_ended_without_a_restart(server):
    before = state("inactive", "dead", invocation="a")
    unit = ScriptedUnit(before, state("inactive", "dead", invocation="b", result="exit-code", status="2"))
    with pytest.raises(ServiceError, match="failed while loading: result exit-code"):
        lifecycle(unit, server).start(before)


def test_start_times_out_saying_what_it_saw():
    before = state("inactive", "dead", invocation="a")
    unit = ScriptedUnit(state("active"))
    with pytest.raises(ServiceError, match=r"not serving 'tiny' .* after 0.3 s \(load_timeout\); last seen: .*health"):
        Lifecycle(
            unit, Settings(url="http://127.0.0.1:9", served_name="tiny", poll_interval=0.05, load_timeout=0.3)
        ).start(before)


def test_a_served_name_that_is_not_listed_ends_the_wait(server):
    unit = ScriptedUnit(state("active"))
    with pytest.raises(ServiceError, match=r"serves \['tiny'\], not 'other': check served_name"):
        Lifecycle(unit, Settings(url=server, served_name="other", poll_interval=0.01)).wait_ready()


@pytest.mark.parametrize(
    ("exec_start", "seconds"),
    [
        ("{ path=/p ; argv[]=/p -m vllm --shutdown-timeout 10 ; ignore_errors=no }", 10.0),
        ("{ path=/p ; argv[]=/p -m vllm --port 8000 ; ignore_errors=no }", 0.0),
        ("{ path=/p ; argv[]=/p --shutdown-timeout=x ; ignore_errors=no }", 0.0),
    ],
)
def test_server_drain_timeout(exec_start, seconds):
    assert server_drain_timeout(parse_show("u.service", f"ExecStart={exec_start}\n")) == seconds


def test_a_group_serves_only_when_each_data_parallel_rank_computes_a_token():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GroupServer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        ready, seen = lifecycle(ScriptedUnit(state("active")), url, group_ranks=2).readiness()
        assert (ready, seen["ranks"]) == (False, ["HTTP 200", "HTTP 500"])
        assert _GroupServer.ranks_asked == ["0", "1"]
        # One replica over the hosts (tensor or pipeline parallel across them) is one rank, which must compute too.
        assert lifecycle(ScriptedUnit(state("active")), url, group_ranks=1).readiness() == (
            True,
            {"health": "HTTP 200", "models": ["tiny"], "ranks": ["HTTP 200"]},
        )
        assert lifecycle(ScriptedUnit(state("active")), url).readiness() == (
            True,
            {"health": "HTTP 200", "models": ["tiny"]},
        )
    finally:
        httpd.shutdown()
